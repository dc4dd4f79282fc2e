//! Placeholder: this package only owns examples/ and benches/.
