//! Running cargo and reading its test results.
