//! Shared by the `tools_*` examples (the programs `cargo xtask bench --tools` runs against
//! rdma-core's `cmtime` and perftest's `ib_send_lat`): per-operation statistics and the one
//! machine-readable line format `cargo xtask bench --tools` reads.
//!
//! Every result is one line on stdout: `@tools <bench> key=value key=value ...`, values without
//! spaces; times in microseconds.

#![allow(dead_code)] // each example uses a part

use std::fmt::Write as _;
use std::net::SocketAddr;
use std::ops::RangeInclusive;
use std::str::FromStr;
use std::time::{Duration, Instant};

/// Summary of a set of samples, in microseconds.
#[derive(Debug, Clone, Copy)]
pub struct Stats {
    pub n: usize,
    pub p50: f64,
    pub p99: f64,
    pub min: f64,
    pub max: f64,
}

impl Stats {
    /// The median, the 99th percentile (nearest rank), min and max of `samples` (µs); `None`
    /// when there are none.
    pub fn of(samples: &[f64]) -> Option<Stats> {
        if samples.is_empty() {
            return None;
        }
        let mut s = samples.to_vec();
        s.sort_by(f64::total_cmp);
        Some(Stats {
            n: s.len(),
            p50: percentile(&s, 50.0),
            p99: percentile(&s, 99.0),
            min: s[0],
            max: s[s.len() - 1],
        })
    }

    /// `n= p50_us= p99_us= min_us= max_us=`.
    pub fn fields(&self) -> String {
        format!(
            "n={} p50_us={:.2} p99_us={:.2} min_us={:.2} max_us={:.2}",
            self.n, self.p50, self.p99, self.min, self.max
        )
    }
}

/// The nearest-rank percentile `p` (0..=100) of sorted samples (the median of an even count
/// is the mean of the middle two).
pub fn percentile(sorted: &[f64], p: f64) -> f64 {
    let n = sorted.len();
    if p == 50.0 && n.is_multiple_of(2) {
        return (sorted[n / 2 - 1] + sorted[n / 2]) / 2.0;
    }
    let rank = ((p / 100.0) * n as f64).ceil() as usize;
    sorted[rank.clamp(1, n) - 1]
}

/// A duration in microseconds.
pub fn us(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

/// Prints one result line: `@tools <bench> <fields>`.
pub fn emit(bench: &str, fields: &[(&str, String)]) {
    let mut line = format!("@tools {bench}");
    for (k, v) in fields {
        let _ = write!(line, " {k}={v}");
    }
    println!("{line}");
}

/// Whether an RDMA device is there: without one, prints `skipping <program>: <reason>` on
/// stderr and returns `false` (the program then exits 0); under `EVCHAN_REQUIRE_DEVICE=1` it
/// exits with status 1 instead.
pub fn device_present(program: &str) -> bool {
    match evchan_core::device::probe() {
        Ok(_) => true,
        Err(e) if std::env::var("EVCHAN_REQUIRE_DEVICE").is_ok_and(|v| v == "1") => {
            eprintln!("{program}: EVCHAN_REQUIRE_DEVICE=1 but {e}");
            std::process::exit(1);
        }
        Err(e) => {
            eprintln!("skipping {program}: {e} (run `cargo xtask bench --tools`)");
            false
        }
    }
}

/// Connects to `addr` with `config`, again every 50 ms while the request is rejected with
/// reason 8 (nobody listens there yet: the server is still starting) and `deadline` has not
/// passed.
pub async fn connect_when_listening(
    addr: SocketAddr,
    config: &evchan::Config,
    deadline: Instant,
) -> Result<evchan::Connection, evchan::Error> {
    loop {
        match evchan::Connection::builder()
            .config(config.clone())
            .connect(addr)
            .await
        {
            Err(evchan::Error::Rejected { reason, .. })
                if reason.0 == 8 && Instant::now() < deadline =>
            {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            r => return r,
        }
    }
}

/// A fatal error: the message on stderr, exit status 1.
pub fn fail(program: &str, what: impl std::fmt::Display) -> ! {
    eprintln!("{program}: {what}");
    std::process::exit(1);
}

/// A program's command line, for its errors: each one line naming the flag, then the usage,
/// on stderr; exit status 2. Checked before [`device_present`], so a bad command line is an
/// error even where there is no device.
#[derive(Debug, Clone, Copy)]
pub struct Cli {
    pub program: &'static str,
    pub usage: &'static str,
}

impl Cli {
    /// A bad command line: `program: what`, then the usage; exit status 2.
    pub fn error(&self, what: impl std::fmt::Display) -> ! {
        eprintln!("{}: {what}\n{}", self.program, self.usage);
        std::process::exit(2);
    }

    /// The command line as `--flag value` pairs; a flag without its value is an
    /// [`error`](Self::error).
    pub fn pairs(&self) -> Vec<(String, String)> {
        let mut it = std::env::args().skip(1);
        let mut pairs = Vec::new();
        while let Some(flag) = it.next() {
            let value = it
                .next()
                .unwrap_or_else(|| self.error(format_args!("{flag} needs a value")));
            pairs.push((flag, value));
        }
        pairs
    }

    /// `flag`'s value as a number within `range`; else an [`error`](Self::error) naming it.
    pub fn number<T>(&self, flag: &str, value: &str, range: RangeInclusive<T>) -> T
    where
        T: FromStr + PartialOrd + std::fmt::Display,
        T::Err: std::fmt::Display,
    {
        match value.parse::<T>() {
            Err(e) => self.error(format_args!("{flag}: {e}: `{value}`")),
            Ok(n) if n < *range.start() => self.error(format_args!(
                "{flag} must be at least {}, not {n}",
                range.start()
            )),
            Ok(n) if n > *range.end() => self.error(format_args!(
                "{flag} must be at most {}, not {n}",
                range.end()
            )),
            Ok(n) => n,
        }
    }

    /// `flag`'s value as an address (`IP:PORT`).
    pub fn addr(&self, flag: &str, value: &str) -> SocketAddr {
        value
            .parse()
            .unwrap_or_else(|e| self.error(format_args!("{flag}: {e}: `{value}`")))
    }

    /// `flag`'s value as an address to connect to: a port of 0 is none.
    pub fn peer(&self, flag: &str, value: &str) -> SocketAddr {
        let a = self.addr(flag, value);
        if a.port() == 0 {
            self.error(format_args!("{flag}: port 0 cannot be connected to"));
        }
        a
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles() {
        let s: Vec<f64> = (1..=100).map(f64::from).collect();
        let st = Stats::of(&s).unwrap();
        assert_eq!((st.p50, st.p99, st.min, st.max), (50.5, 99.0, 1.0, 100.0));
        assert_eq!(percentile(&[3.0], 99.0), 3.0);
        assert!(Stats::of(&[]).is_none());
    }
}
