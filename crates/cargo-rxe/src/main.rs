//! `cargo rxe`: see the library's [`cli::USAGE`](cargo_rxe::cli::USAGE).

use std::process::ExitCode;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match cargo_rxe::cli::main(&args) {
        Ok(code) => ExitCode::from(u8::try_from(code.clamp(0, 255)).unwrap_or(1)),
        Err(msg) => {
            eprintln!("cargo-rxe: {msg}");
            ExitCode::FAILURE
        }
    }
}
