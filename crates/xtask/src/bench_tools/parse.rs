//! Reading the tools run's output: every result line of cmtime, `ib_send_lat` and our
//! programs into [`Results`], each figure's value of every round, by round.

use std::collections::BTreeMap;
use std::fmt::Debug;

use super::STEPS;

/// A figure's value in each round that read one, by the round's number: the script's last
/// `@@tools round=N` marker before the value's line (0 before any marker). Both sides of a
/// ratio read in the same round ran minutes at most apart, under the same load.
pub(super) type Rounds<T = f64> = BTreeMap<u32, T>;

/// A throughput figure: (mode, message size, connections, `tool` or `ours`).
pub(super) type StreamKey = (String, u32, u32, String);

/// What the run printed, by figure: every round's value.
#[derive(Debug, Default)]
pub(super) struct Results {
    /// (layer, step) → per-connection µs of each round; `layer` is `cmtime` for the tool.
    pub(super) cm: BTreeMap<(String, String), Rounds>,
    /// (layer, step) → the per-connection p99 of each round (ours only).
    pub(super) cm_p99: BTreeMap<(String, String), Rounds>,
    /// ("event"|"busy", "tool" or a driver of [`DRIVERS`](super::DRIVERS)) → (round-trip p50,
    /// p99) of each round, µs: `ib_send_lat`'s, or ours with that driver.
    pub(super) lat: BTreeMap<(String, String), Rounds<(f64, f64)>>,
    /// (mode, size, connections, "tool"|"ours") → (messages/s, MB/s) of each round:
    /// `ib_send_bw`'s, or `tools_stream`'s.
    pub(super) bw: BTreeMap<StreamKey, Rounds<(f64, f64)>>,
    /// The ping-pong client's `tools_pingpong` flags → (round trips, callgrind's total).
    pub(super) cg: BTreeMap<String, BTreeMap<u32, u64>>,
    /// (layer, channels) → events/s of each round.
    pub(super) events: BTreeMap<(String, u32), Rounds>,
    /// (layer) → the events counted in each run (`spin`: its units of work).
    pub(super) event_counts: BTreeMap<String, Vec<u64>>,
    /// `drain`: the reads of each run that found no event queued and waited (`waits=`).
    pub(super) drain_waits: Vec<u64>,
    /// (figure, "tool"|"ours") → the one-sided figure of each round: an operation's p50 (µs)
    /// or MB/s; the figures are `tools_remote`'s `mode-poll` (`read-lat-event`, ...).
    pub(super) remote: BTreeMap<(String, String), Rounds>,
    /// The figure of the last `@@tools rem` marker: the next perftest result line is its.
    rem_fig: Option<String>,
    /// The `mode` of the last `@@tools isl` marker: the next result line is its.
    isl_mode: Option<String>,
    /// The (mode, size, connections) of the last `@@tools isb` marker: the next result line
    /// is its.
    isb_run: Option<(String, u32, u32)>,
    /// The number of the last `@@tools round=` marker (each phase counts its rounds from 1).
    round: u32,
    pub(super) failures: Vec<String>,
}

/// Records `value` as `key`'s in `round`; a second value of one key in one round is reported
/// in `failures` and left out (the first one stays).
fn put<K: Ord + Debug, T>(
    map: &mut BTreeMap<K, Rounds<T>>,
    key: K,
    round: u32,
    value: T,
    failures: &mut Vec<String>,
) {
    if map.get(&key).is_some_and(|r| r.contains_key(&round)) {
        failures.push(format!(
            "a second result of {key:?} in round {round}, left out"
        ));
    } else {
        map.entry(key).or_default().insert(round, value);
    }
}

/// `key=value` fields of a result line, the `stats=` field's own fields flattened in.
fn fields(line: &str) -> BTreeMap<&str, &str> {
    line.split_whitespace()
        .flat_map(|f| f.split(','))
        .filter_map(|f| f.split_once('='))
        .filter(|(k, _)| *k != "stats")
        .chain(
            line.split_whitespace()
                .filter_map(|f| f.strip_prefix("stats="))
                .flat_map(|f| f.split(','))
                .filter_map(|f| f.split_once('=')),
        )
        .collect()
}

/// The `mode=`, `size=` and `conns=` of a throughput marker or result line.
fn stream_key(f: &BTreeMap<&str, &str>) -> Option<(String, u32, u32)> {
    Some((
        (*f.get("mode")?).to_owned(),
        f.get("size")?.parse().ok()?,
        f.get("conns")?.parse().ok()?,
    ))
}

/// `ib_send_lat`'s result line for messages of `size` bytes (`#bytes #iterations t_min t_max
/// t_typical t_avg t_stdev 99% 99.9%`, each time half a round trip): the round trip's p50 and
/// p99 in µs, `t_typical` and `99%` doubled. `None` for any other line. (`t_stdev` may read
/// `-nan`; only the size, `t_typical` and `99%` are read.)
pub(crate) fn send_lat_result(line: &str, size: u32) -> Option<(f64, f64)> {
    let v: Vec<&str> = line.split_whitespace().collect();
    let num = |i: usize| v.get(i).and_then(|t| t.parse::<f64>().ok());
    match (v.len(), num(0), num(4), num(7)) {
        (9, Some(bytes), Some(typical), Some(p99)) if bytes == f64::from(size) => {
            Some((2.0 * typical, 2.0 * p99))
        }
        _ => None,
    }
}

impl Results {
    pub(super) fn add_line(&mut self, line: &str) {
        let line = line.trim();
        let num = |f: &BTreeMap<&str, &str>, k: &str| f.get(k).and_then(|v| v.parse::<f64>().ok());
        if let Some(rest) = line.strip_prefix("@@tools failed: ") {
            self.failures.push(rest.to_owned());
        } else if line.starts_with("event: ") || line.starts_with("RDMA_CM_EVENT_") {
            // cmtime 44 reports a failed connection this way and goes on with the others:
            // its figures of that run then cover fewer connections.
            self.failures.push(format!("cmtime: {line}"));
        } else if line == "@@tools reset" {
            // A failed tool's output follows: no figure's.
            self.rem_fig = None;
            self.isb_run = None;
            self.isl_mode = None;
        } else if let Some(rest) = line.strip_prefix("@@tools round=") {
            match rest.parse() {
                Ok(n) => self.round = n,
                Err(_) => self.failures.push(format!("a bad marker: {line}")),
            }
        } else if let Some(rest) = line.strip_prefix("@@tools isl mode=") {
            self.isl_mode = Some(rest.to_owned());
        } else if let Some(rest) = line.strip_prefix("@@tools cg ") {
            let (head, flags) = rest.split_once("flags=").unwrap_or((rest, ""));
            let f = fields(head);
            match (
                f.get("iters").and_then(|v| v.parse().ok()),
                f.get("total").and_then(|v| v.parse().ok()),
            ) {
                (Some(n), Some(t)) => {
                    self.cg
                        .entry(flags.trim().to_owned())
                        .or_default()
                        .insert(n, t);
                }
                _ => self.failures.push(format!("no callgrind total: {line}")),
            }
        } else if let Some(rest) = line.strip_prefix("@@tools rem fig=") {
            self.rem_fig = Some(rest.trim().to_owned());
        } else if let Some(rest) = line.strip_prefix("@tools remote ") {
            let f = fields(rest);
            let value = num(&f, "p50_us").or_else(|| num(&f, "mb_per_s"));
            if let (Some(mode), Some(poll), Some(v)) = (f.get("mode"), f.get("poll"), value) {
                let key = (format!("{mode}-{poll}"), "ours".to_owned());
                put(&mut self.remote, key, self.round, v, &mut self.failures);
            }
        } else if let Some(rest) = line.strip_prefix("@@tools isb ") {
            self.isb_run = stream_key(&fields(rest));
            if self.isb_run.is_none() {
                self.failures.push(format!("a bad marker: {line}"));
            }
        } else if let Some(rest) = line.strip_prefix("@tools stream ") {
            let f = fields(rest);
            if let (Some((mode, size, conns)), Some(rate), Some(mb)) =
                (stream_key(&f), num(&f, "msgs_per_s"), num(&f, "mb_per_s"))
            {
                let key = (mode, size, conns, "ours".to_owned());
                put(
                    &mut self.bw,
                    key,
                    self.round,
                    (rate, mb),
                    &mut self.failures,
                );
            }
        } else if let Some(rest) = line.strip_prefix("@tools cm ") {
            let f = fields(rest);
            if let (Some(layer), Some(step), Some(per), Some(p99)) = (
                f.get("layer"),
                f.get("step"),
                num(&f, "per_conn_us"),
                num(&f, "p99_us"),
            ) {
                let key = ((*layer).to_owned(), (*step).to_owned());
                let r = self.round;
                put(&mut self.cm, key.clone(), r, per, &mut self.failures);
                put(&mut self.cm_p99, key, r, p99, &mut self.failures);
            }
        } else if let Some(rest) = line.strip_prefix("@tools pingpong ") {
            let f = fields(rest);
            // A line without `driver=` is a current-thread runtime's, one without `app=` from
            // `block_on`'s future.
            let driver = f.get("driver").copied().unwrap_or("current");
            let driver = match f.get("app") {
                Some(&"spawn") => format!("{driver}-spawn"),
                _ => driver.to_owned(),
            };
            if let (Some(mode), Some(p50), Some(p99)) =
                (f.get("mode"), num(&f, "p50_us"), num(&f, "p99_us"))
            {
                let key = ((*mode).to_owned(), driver);
                put(
                    &mut self.lat,
                    key,
                    self.round,
                    (p50, p99),
                    &mut self.failures,
                );
            }
        } else if let Some(rest) = line.strip_prefix("@tools events ") {
            let f = fields(rest);
            // `spin` counts units of work, not events.
            if let (Some(layer), Some(c), Some(count), Some(rate)) = (
                f.get("layer"),
                f.get("channels").and_then(|c| c.parse().ok()),
                f.get("events")
                    .or_else(|| f.get("units"))
                    .and_then(|c| c.parse().ok()),
                num(&f, "events_per_s").or_else(|| num(&f, "units_per_s")),
            ) {
                let layer = (*layer).to_owned();
                if layer == "drain" {
                    if let Some(w) = f.get("waits").and_then(|w| w.parse().ok()) {
                        self.drain_waits.push(w);
                    }
                }
                let key = (layer.clone(), c);
                put(&mut self.events, key, self.round, rate, &mut self.failures);
                self.event_counts.entry(layer).or_default().push(count);
            }
        } else if let Some((name, values)) = line.split_once(':') {
            // cmtime 44: `%-13s: total_ms max_ms min_us us_per_conn`.
            let name = name.trim();
            if let Some((_, step)) = STEPS.iter().find(|(c, _)| *c == name) {
                let v: Vec<f64> = values
                    .split_whitespace()
                    .filter_map(|v| v.parse().ok())
                    .collect();
                if let [_, _, _, per] = v.as_slice() {
                    let key = ("cmtime".to_owned(), (*step).to_owned());
                    put(&mut self.cm, key, self.round, *per, &mut self.failures);
                }
            }
        } else if let Some(fig) = self.rem_fig.clone() {
            // perftest: a latency line (`#bytes #iterations t_min t_max t_typical ...`, the
            // whole operation's time: READ and atomics are not halved) or a bandwidth line
            // (`#bytes #iterations BW peak BW average MsgRate`).
            let v: Vec<f64> = line
                .split_whitespace()
                .map(|t| t.parse().unwrap_or(f64::NAN))
                .collect();
            // The figure's size: 8 (an atomic), 64 (a READ's latency), 64 KiB (bandwidth).
            let size = if fig.starts_with("atomic") {
                8.0
            } else if fig.contains("-lat-") {
                64.0
            } else {
                65536.0
            };
            let value = match v.len() {
                9 if v[0] == size => Some(v[4]),
                5 if v[0] == size => Some(v[3]),
                _ => None,
            };
            if let Some(value) = value.filter(|x| x.is_finite()) {
                let key = (fig, "tool".to_owned());
                put(&mut self.remote, key, self.round, value, &mut self.failures);
                self.rem_fig = None;
            }
        } else if let Some((mode, size, conns)) = self.isb_run.clone() {
            // perftest: `#bytes #iterations BW peak[MB/sec] BW average[MB/sec] MsgRate[Mpps]`.
            let v: Vec<f64> = line
                .split_whitespace()
                .map_while(|t| t.parse().ok())
                .collect();
            if let [bytes, _, _, mb, mpps] = v[..] {
                if bytes == f64::from(size) {
                    let key = (mode, size, conns, "tool".to_owned());
                    let v = (mpps * 1e6, mb);
                    put(&mut self.bw, key, self.round, v, &mut self.failures);
                    self.isb_run = None;
                }
            }
        } else if let Some(mode) = self.isl_mode.clone() {
            if let Some(v) = send_lat_result(line, 64) {
                let key = (mode, "tool".to_owned());
                put(&mut self.lat, key, self.round, v, &mut self.failures);
                self.isl_mode = None;
            }
        }
    }

    /// The per-round sums of `steps` for `layer` (the rounds where all were read).
    pub(super) fn sum(&self, layer: &str, steps: &[&str]) -> Rounds {
        let cols: Vec<&Rounds> = steps
            .iter()
            .filter_map(|s| self.cm.get(&(layer.to_owned(), (*s).to_owned())))
            .collect();
        let Some((first, rest)) = cols.split_first().filter(|_| cols.len() == steps.len()) else {
            return Rounds::new();
        };
        first
            .iter()
            .filter_map(|(r, v)| {
                rest.iter()
                    .map(|c| c.get(r))
                    .sum::<Option<f64>>()
                    .map(|s| (*r, v + s))
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::bench_tools::report::Section;
    use crate::bench_tools::Plan;

    /// The section of `r` for a plan of `cm_rounds`, `lat_rounds` of `iters` and one events
    /// round.
    fn section(r: &Results, cm_rounds: u32, lat_rounds: u32, iters: u32) -> Section {
        let plan = Plan {
            cm_rounds,
            lat_rounds,
            iters,
            stream_rounds: 1,
            stream_scale: 1,
            event_rounds: 1,
            remote_rounds: 1,
        };
        r.section(&plan, Duration::from_secs(1), "1", "1")
    }

    #[test]
    fn parses_the_one_sided_rows() {
        let mut r = Results::default();
        for line in [
            "@@tools round=2",
            "@@tools rem fig=read-lat-event",
            " #bytes #iterations    t_min[usec]    t_max[usec]  t_typical[usec]    t_avg[usec]    t_stdev[usec]   99% percentile[usec]   99.9% percentile[usec] ",
            " 64      1000          154.42         702.56       219.35   \t       235.11      \t58.59  \t\t490.44  \t\t702.56 ",
            "@tools remote mode=read-lat poll=event size=64 stats=n=1000,p50_us=152.35,p99_us=434.54,min_us=139.47,max_us=2031.33",
            "@@tools rem fig=write-bw-busy",
            " #bytes     #iterations    BW peak[MB/sec]    BW average[MB/sec]   MsgRate[Mpps]",
            " 65536      2000             27.82              23.57  \t\t   0.000377",
            "@tools remote mode=write-bw poll=busy size=65536 ops=2000 secs=7.240 mb_per_s=17.26",
        ] {
            r.add_line(line);
        }
        let get = |fig: &str, who: &str| r.remote[&(fig.to_owned(), who.to_owned())].clone();
        assert_eq!(get("read-lat-event", "tool"), Rounds::from([(2, 219.35)]));
        assert_eq!(get("read-lat-event", "ours"), Rounds::from([(2, 152.35)]));
        assert_eq!(get("write-bw-busy", "tool"), Rounds::from([(2, 23.57)]));
        assert_eq!(get("write-bw-busy", "ours"), Rounds::from([(2, 17.26)]));
        assert!(r.failures.is_empty(), "{:?}", r.failures);
        let text = section(&r, 1, 1, 300).text;
        assert!(
            text.contains("| READ 64 B latency p50, event mode vs `ib_read_lat -R -e -s 64` | 152 | 219 | 0.69 |"),
            "{text}"
        );
    }

    #[test]
    fn parses_both_tools_and_ours() {
        let mut r = Results::default();
        for line in [
            "step              total ms     max ms     min us  us / conn",
            "create id    :      185.62     140.57       7.00    1856.17",
            "connect      :     1442.82    1409.44  312014.00   14428.24",
            "@tools cm layer=raw step=connect conns=100 total_us=518900.5 per_conn_us=5189.01 \
             stats=n=100,p50_us=367375.67,p99_us=501083.99,min_us=35060.18,max_us=501203.53",
            "@@tools isl mode=event",
            " #bytes #iterations    t_min[usec]    t_max[usec]  t_typical[usec]",
            " 64      500          113.80         325062.80      3866.81  \t       5739.29     \t-nan   \t\t55566.31 \t\t325062.80",
            "@tools pingpong mode=event size=64 stats=n=500,p50_us=900.00,p99_us=2000.00,min_us=1.00,max_us=3.00",
            "@tools events layer=async channels=4 conns=256 events=1792 connect_s=1 wall_s=2 events_per_s=896.0",
            "@@tools failed: tools_cm async",
        ] {
            r.add_line(line);
        }
        assert_eq!(
            r.cm[&("cmtime".into(), "create_id".into())],
            Rounds::from([(0, 1856.17)])
        );
        assert_eq!(
            r.cm[&("cmtime".into(), "connect".into())],
            Rounds::from([(0, 14428.24)])
        );
        assert_eq!(
            r.cm[&("raw".into(), "connect".into())],
            Rounds::from([(0, 5189.01)])
        );
        assert_eq!(
            r.cm_p99[&("raw".into(), "connect".into())],
            Rounds::from([(0, 501083.99)])
        );
        assert_eq!(
            r.lat[&("event".into(), "tool".into())],
            Rounds::from([(0, (2.0 * 3866.81, 2.0 * 55566.31))])
        );
        // A line without `driver=` is the current-thread runtime's.
        assert_eq!(
            r.lat[&("event".into(), "current".into())],
            Rounds::from([(0, (900.0, 2000.0))])
        );
        assert_eq!(r.events[&("async".into(), 4)], Rounds::from([(0, 896.0)]));
        assert_eq!(r.failures, vec!["tools_cm async".to_owned()]);
        let s = section(&r, 1, 1, 500).text;
        assert!(
            s.contains("| raw: connect | 5189 | 14428 | 0.36 | 0.36 (0.36–0.36) | 501084 | 0 % |"),
            "{s}"
        );
        assert!(s.contains("Failed in the VM: tools_cm async"), "{s}");
        assert!(
            s.contains(
                "| RTT p50, event mode, current-thread runtime vs `ib_send_lat -R -e` | 900 | 7734 | 0.12 | \
                 0.12 (0.12–0.12) | 2000 / 111133 | 0 % | ≤ 1.15 | yes |"
            ),
            "{s}"
        );
        // No multi-thread line was read: its rows say so instead of vanishing.
        assert!(
            s.contains(
                "| RTT p50, event mode, multi-thread runtime, block_on vs `ib_send_lat -R -e` | – | 7734 | – | – | \
                 – / 111133 | – | ≤ 1.15 | no figure |"
            ),
            "{s}"
        );
    }

    #[test]
    fn parses_every_driver_in_both_modes() {
        let mut r = Results::default();
        for line in [
            "@@tools round=1",
            "@@tools isl mode=busy",
            " 64      300          10.00         20.00      12.50  \t       13.00     \t1.00   \t\t40.00 \t\t50.00",
            "@tools pingpong mode=busy driver=current size=64 stats=n=300,p50_us=250.00,p99_us=1000.00,min_us=1.00,max_us=3.00",
            "@tools pingpong mode=busy driver=multi size=64 stats=n=300,p50_us=50.00,p99_us=200.00,min_us=1.00,max_us=3.00",
            "@tools pingpong mode=event driver=multi size=64 stats=n=300,p50_us=300.00,p99_us=600.00,min_us=1.00,max_us=3.00",
            "@tools pingpong mode=busy driver=multi app=spawn size=64 stats=n=300,p50_us=28.00,p99_us=100.00,min_us=1.00,max_us=3.00",
            "@tools pingpong mode=busy driver=core size=64 stats=n=300,p50_us=26.00,p99_us=90.00,min_us=1.00,max_us=3.00",
            "@tools pingpong mode=busy driver=core-tokio size=64 stats=n=300,p50_us=30.00,p99_us=95.00,min_us=1.00,max_us=3.00",
            // Round 2 has no `ib_send_lat` line: its figures count in the medians, not in the
            // paired ratios.
            "@@tools round=2",
            "@tools pingpong mode=event driver=multi size=64 stats=n=300,p50_us=500.00,p99_us=800.00,min_us=1.00,max_us=3.00",
            "@tools pingpong mode=busy driver=multi app=block_on size=64 stats=n=300,p50_us=60.00,p99_us=300.00,min_us=1.00,max_us=3.00",
        ] {
            r.add_line(line);
        }
        assert_eq!(
            r.lat[&("busy".into(), "tool".into())],
            Rounds::from([(1, (25.0, 80.0))])
        );
        assert_eq!(
            r.lat[&("busy".into(), "current".into())],
            Rounds::from([(1, (250.0, 1000.0))])
        );
        assert_eq!(
            r.lat[&("busy".into(), "multi".into())],
            Rounds::from([(1, (50.0, 200.0)), (2, (60.0, 300.0))])
        );
        assert_eq!(
            r.lat[&("busy".into(), "multi-spawn".into())],
            Rounds::from([(1, (28.0, 100.0))])
        );
        assert_eq!(
            r.lat[&("event".into(), "multi".into())],
            Rounds::from([(1, (300.0, 600.0)), (2, (500.0, 800.0))])
        );
        assert!(!r.lat.contains_key(&("event".into(), "current".into())));
        let s = section(&r, 1, 2, 300).text;
        for want in [
            "| RTT p50, busy-poll, current-thread runtime vs `ib_send_lat -R` | 250 | 25.0 | 10.00 | 10.00 (10.00–10.00) | 1000 / 80.0 | 0 % | ≤ 1.20 | **no** |",
            "| RTT p99, busy-poll, current-thread runtime vs `ib_send_lat -R` | 1000 | 80.0 | 12.50 | 12.50 (12.50–12.50) |  | 0 % |  |  |",
            // The median of 50 and 60 against round 1's tool; paired: round 1's 50 alone.
            "| RTT p50, busy-poll, multi-thread runtime, block_on vs `ib_send_lat -R` | 55.0 | 25.0 | 2.20 | 2.00 (2.00–2.00) | 250 / 80.0 | 18 % | ≤ 1.20 | **no** |",
            "| RTT p50, busy-poll, multi-thread runtime, spawned task vs `ib_send_lat -R` | 28.0 | 25.0 | 1.12 | 1.12 (1.12–1.12) | 100 / 80.0 | 0 % | ≤ 1.20 | yes |",
            "| RTT p50, busy-poll, core layer, no runtime vs `ib_send_lat -R` | 26.0 | 25.0 | 1.04 | 1.04 (1.04–1.04) | 90.0 / 80.0 | 0 % |  |  |",
            "| RTT p50, busy-poll, core layer, tokio waits vs `ib_send_lat -R` | 30.0 | 25.0 | 1.20 | 1.20 (1.20–1.20) | 95.0 / 80.0 | 0 % |  |  |",
            "| RTT p50, event mode, multi-thread runtime, block_on vs `ib_send_lat -R -e` | 400 | – | – | – | 700 / – | 50 % | ≤ 1.15 | no figure |",
        ] {
            assert!(s.contains(want), "{want}\n{s}");
        }
    }

    #[test]
    fn instructions_per_round_trip_from_two_callgrind_runs() {
        let mut r = Results::default();
        for line in [
            "@@tools cg iters=300 total=3000000 flags=",
            "@@tools cg iters=1300 total=6000000 flags=",
            "@@tools cg iters=300 total=40000000 flags=--layer core --tokio",
            "@@tools cg iters=1300 total=42000000 flags=--layer core --tokio",
            "@@tools cg iters=300 total= flags=--multi-thread --spawn",
        ] {
            r.add_line(line);
        }
        assert_eq!(r.failures.len(), 1, "{:?}", r.failures);
        let s = section(&r, 1, 1, 300);
        for want in [
            "| instructions per round trip, current-thread runtime vs core layer, tokio waits | 3000 | 2000 | 1.50 | ≤ 1.50 | yes |",
            "| instructions per round trip, multi-thread runtime, spawned task vs core layer, tokio waits | – | 2000 | – | ≤ 1.50 | no figure |",
            "| instructions per round trip, core layer, tokio waits vs core layer, tokio waits | 2000 | 2000 | 1.00 |  |  |",
        ] {
            assert!(s.text.contains(want), "{want}\n{}", s.text);
        }
        assert!(s.ratios.iter().any(|t| t.name
            == "tools: instructions per round trip, current-thread runtime"
            && t.ratio == 1.5
            && !t.higher_is_better));
    }

    #[test]
    fn parses_throughput_of_both_sides() {
        let mut r = Results::default();
        for line in [
            "@@tools round=1",
            "@@tools isb mode=event size=64 conns=1",
            " #bytes     #iterations    BW peak[MB/sec]    BW average[MB/sec]   MsgRate[Mpps]",
            " 64         20000            1.66               1.05   \t\t   0.017176",
            "@tools stream mode=event conns=1 size=64 msgs=20000 secs=1.2311 msgs_per_s=15000 mb_per_s=0.99",
            "@@tools isb mode=busy size=65536 conns=1",
            " 65536      2000             51.14              50.00  \t\t   0.000790",
            "@tools stream mode=busy conns=1 size=65536 msgs=2000 secs=2.9152 msgs_per_s=686 mb_per_s=49.00",
            "@@tools isb mode=event-zc size=65536 conns=1",
            " 65536      2000             40.00              40.00  \t\t   0.000640",
            "@tools stream mode=event-zc conns=1 size=65536 msgs=2000 secs=3.2 msgs_per_s=625 mb_per_s=39.00",
            "@@tools isb bad",
        ] {
            r.add_line(line);
        }
        let key = |mode: &str, size, who: &str| (mode.to_owned(), size, 1, who.to_owned());
        assert_eq!(
            r.bw[&key("event", 64, "tool")],
            Rounds::from([(1, (17176.0, 1.05))])
        );
        assert_eq!(
            r.bw[&key("busy", 65536, "ours")],
            Rounds::from([(1, (686.0, 49.0))])
        );
        assert_eq!(r.failures, vec!["a bad marker: @@tools isb bad".to_owned()]);
        let s = section(&r, 1, 1, 300).text;
        for want in [
            "| messages/s, 64 B, 1 connection, event mode vs `ib_send_bw -R -e` | 15000 | 17176 | 0.87 | 0.87 (0.87–0.87) |  | 0 % | ≥ 0.80 | yes |",
            "| MB/s, 64 KiB, 1 connection, busy-poll vs `ib_send_bw -R` | 49.0 | 50.0 | 0.98 | 0.98 (0.98–0.98) |  | 0 % | ≥ 0.95 | yes |",
            "| messages/s, 64 B, 4 connections, busy-poll vs `ib_send_bw -R` | – | – | – | – |  | – | ≥ 0.80 | no figure |",
            "| MB/s, 64 KiB, 1 connection, zero-copy from 16 registered buffers, event mode vs `ib_send_bw -R -e` | 39.0 | 40.0 | 0.97 | 0.97 (0.97–0.97) |  | 0 % | ≥ 0.95 | yes |",
        ] {
            assert!(s.contains(want), "{want}\n{s}");
        }
    }

    #[test]
    fn pairs_each_round_with_its_own_baseline() {
        let mut r = Results::default();
        let cm = |layer: &str, step: &str, per: f64| {
            format!(
                "@tools cm layer={layer} step={step} conns=100 total_us=1 per_conn_us={per} \
                 stats=n=100,p50_us=1,p99_us=1,min_us=1,max_us=1"
            )
        };
        let mut lines = vec![];
        // Round 1 fast, round 2 twice as slow, round 3 without its raw connect.
        for (round, speed) in [(1, 1.0), (2, 2.0), (3, 1.0)] {
            lines.push(format!("@@tools round={round}"));
            lines.push(format!("create id    :  1 1 1 {}", 10.0 * speed));
            lines.push(format!("connect      :  1 1 1 {}", 100.0 * speed));
            lines.push(cm("raw", "create_id", 11.0 * speed));
            if round != 3 {
                lines.push(cm("raw", "connect", 120.0 * speed));
            }
        }
        // A second cmtime line in round 3: reported, the first kept.
        lines.push("connect      :  1 1 1 500".to_owned());
        for line in &lines {
            r.add_line(line);
        }
        assert_eq!(
            r.cm[&("cmtime".into(), "connect".into())],
            Rounds::from([(1, 100.0), (2, 200.0), (3, 100.0)])
        );
        assert_eq!(r.failures.len(), 1, "{:?}", r.failures);
        assert!(r.failures[0].contains("round 3"), "{:?}", r.failures);
        // A total only for the rounds with every step.
        assert_eq!(
            r.sum("raw", &["create_id", "connect"]),
            Rounds::from([(1, 131.0), (2, 262.0)])
        );
        assert_eq!(r.sum("cmtime", &["create_id", "connect"]).len(), 3);
        let out = section(&r, 3, 1, 300).text;
        // create_id: medians 11 / 10 (rounds 1 and 3) → 1.10; each round's own ratio 1.10.
        assert!(
            out.contains("| raw: create_id | 11.0 | 10.0 | 1.10 | 1.10 (1.10–1.10) |"),
            "{out}"
        );
        // connect: medians 180 (120, 240) against 100 (100, 200, 100): 1.80 of the medians,
        // 1.20 in each round that has both.
        assert!(
            out.contains("| raw: connect | 180 | 100 | 1.80 | 1.20 (1.20–1.20) |"),
            "{out}"
        );
    }

    #[test]
    fn parses_drain_and_its_yardstick() {
        let mut r = Results::default();
        for line in [
            "@tools events layer=drain channels=1 conns=256 rounds=8 events=2048 wall_s=0.0400 \
             round_min_s=0.0040 round_max_s=0.0060 events_per_s=50000.0 waits=0 cpu_s=0.0400 \
             runq_s=0.0010",
            "@tools events layer=drain channels=4 conns=256 rounds=8 events=2048 wall_s=0.0200 \
             round_min_s=0.0020 round_max_s=0.0030 events_per_s=80000.0 waits=3 cpu_s=0.0500 \
             runq_s=0.0200",
            "@tools events layer=spin channels=1 conns=256 rounds=8 units=2048 wall_s=0.0500 \
             units_per_s=40000.0 cpu_s=0.0500 runq_s=0.0000",
            "@tools events layer=spin channels=4 conns=256 rounds=8 units=2048 wall_s=0.0300 \
             units_per_s=70000.0 cpu_s=0.0600 runq_s=0.0300",
        ] {
            r.add_line(line);
        }
        assert_eq!(r.events[&("drain".into(), 4)], Rounds::from([(0, 80000.0)]));
        assert_eq!(r.events[&("spin".into(), 4)], Rounds::from([(0, 70000.0)]));
        assert_eq!(r.event_counts["spin"], vec![2048, 2048]);
        assert_eq!(r.drain_waits, vec![0, 3]);
        let section = section(&r, 1, 1, 300);
        // Tracked: the rate of drain's 4 channels, larger being better; not `spin` (the VM's
        // yardstick), not the 1-channel rows (1 by construction), not the rows without figures.
        let tracked: Vec<_> = section
            .ratios
            .iter()
            .map(|t| (t.name.as_str(), t.ratio, t.higher_is_better))
            .collect();
        assert_eq!(
            tracked,
            vec![("tools: drain: events/s, 4 ch ÷ 1 ch", 1.6, true)]
        );
        let s = section.text;
        for want in [
            "| drain: events/s, 4 ch ÷ 1 ch | 80000 | 50000 | 1.60 | 1.60 (1.60–1.60) |  | 0 % | ≥ 1.50 | yes |",
            "| drain: events/s, 2 ch ÷ 1 ch | – | 50000 | – | – |  | – |  |  |",
            "| spin: units/s, 4 ch ÷ 1 ch | 70000 | 40000 | 1.75 | 1.75 (1.75–1.75) |  | 0 % |  |  |",
            "| async: events/s, 4 ch ÷ 1 ch | – | – | – | – |  | – | ≥ 1.50 | no figure |",
            "queued and waited in `poll`: 3 in all, over 2 `drain` runs.",
        ] {
            assert!(s.contains(want), "{want}\n{s}");
        }
    }
}
