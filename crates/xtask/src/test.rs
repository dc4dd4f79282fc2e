//! `cargo xtask test` and `cargo xtask demo`.
use crate::Result;

pub fn run(_args: &[String]) -> Result<i32> {
    Err("not yet".into())
}

pub fn demo(_args: &[String]) -> Result<i32> {
    Err("not yet".into())
}
