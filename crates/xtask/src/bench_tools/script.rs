//! The guest's shell script of the tools run: what runs in which round, and the marker lines
//! that tell the parser what the next lines are.

use std::fmt::Write as _;
use std::path::Path;

use super::{
    Plan, ADDR, BUSY_POLL_US, CG_DRIVERS, CG_ITERS, CG_WARMUP, CHANNELS, CONNS, DRAIN_ROUNDS,
    DRIVERS, EVENT_CONNS, IN_FLIGHT, LAYERS, REMOTE, REMOTE_BW_OPS, REMOTE_LAT_OPS, STREAMS,
    ZERO_COPY,
};
use crate::vm;

/// The guest's shell script: every server under `timeout`, every client retried while its
/// server is not listening yet; marker lines (`@@tools ...`) say what the next lines are, and
/// `@@tools round=N` begins round N of a phase (every figure of the phase, once each).
pub(super) fn script(examples: &Path, plan: &Plan) -> String {
    let e = vm::shell_join(&[examples.display().to_string()]);
    let mut s = format!(
        "A={ADDR}\nE={e}\nstatus=0\n\
         fail() {{ echo \"@@tools failed: $*\"; status=1; }}\n\
         # A perftest tool (`$1`): server in the background, client retried while nobody\n\
         # listens yet; its output after the marker line `@@tools $2`.\n\
         perf() {{\n\
         \x20 bin=$1; marker=$2; shift 2\n\
         \x20 for try in 1 2 3 4 5 6 7 8 9 10; do\n\
         \x20   timeout 300 $bin -R \"$@\" -F >/dev/null 2>&1 & s=$!\n\
         \x20   sleep 1\n\
         \x20   out=$(timeout 300 $bin -R \"$@\" -F $A 2>&1); rc=$?\n\
         \x20   kill $s 2>/dev/null; wait $s 2>/dev/null\n\
         \x20   if [ $rc = 0 ]; then echo \"@@tools $marker\"; echo \"$out\"; return; fi\n\
         \x20 done\n\
         \x20 echo '@@tools reset'; echo \"$out\"; fail \"$bin $marker\"\n\
         }}\n\
         isl() {{ mode=$1; shift; perf ib_send_lat \"isl mode=$mode\" \"$@\"; }}\n\
         isb() {{ what=$1; shift; perf ib_send_bw \"isb $what\" \"$@\"; }}\n\
         st() {{\n\
         \x20 timeout 300 $E/tools_stream --serve $A:7491 \"$@\" & s=$!\n\
         \x20 timeout 300 $E/tools_stream --connect $A:7491 \"$@\" || {{ kill $s; fail tools_stream \"$@\"; }}\n\
         \x20 wait $s\n\
         }}\n\
         # The client under callgrind (user-space instructions), after its server listens;\n\
         # the marker line gives the program's total.\n\
         cg() {{\n\
         \x20 n=$1; shift\n\
         \x20 timeout 300 $E/tools_pingpong --serve $A:7492 \"$@\" >/dev/null & s=$!; sleep 3\n\
         \x20 timeout 600 valgrind --tool=callgrind --callgrind-out-file=/tmp/evchan-cg.out \\\n\
         \x20   $E/tools_pingpong --connect $A:7492 --warmup {CG_WARMUP} --iters $n \"$@\" >/dev/null 2>&1 \\\n\
         \x20   || fail callgrind tools_pingpong \"$@\"\n\
         \x20 wait $s\n\
         \x20 t=$(callgrind_annotate /tmp/evchan-cg.out 2>/dev/null | awk '/PROGRAM TOTALS/ {{gsub(\",\", \"\", $1); print $1}}')\n\
         \x20 echo \"@@tools cg iters=$n total=$t flags=$*\"\n\
         }}\n\
         rt() {{\n\
         \x20 timeout 300 $E/tools_remote --serve $A:7493 \"$@\" >/dev/null & s=$!\n\
         \x20 timeout 300 $E/tools_remote --connect $A:7493 \"$@\" || {{ kill $s; fail tools_remote \"$@\"; }}\n\
         \x20 wait $s\n\
         }}\n\
         pp() {{\n\
         \x20 timeout 300 $E/tools_pingpong --serve $A:7490 \"$@\" & s=$!\n\
         \x20 timeout 300 $E/tools_pingpong --connect $A:7490 \"$@\" || {{ kill $s; fail tools_pingpong \"$@\"; }}\n\
         \x20 wait $s\n\
         }}\n\
         # A fresh `cmtime -b` for every client: cmtime 44's server shares the CQs of its first\n\
         # accepted id, freed with that id once no other QP holds them; a later request then\n\
         # fails (reject, reason 28). Each client starts once the server listens.\n\
         cmsrv() {{\n\
         \x20 timeout 300 cmtime -b $A >/dev/null 2>&1 & cs=$!\n\
         \x20 for i in $(seq 100); do\n\
         \x20   rdma resource show cm_id 2>/dev/null | grep -q 'state LISTEN.*comm cmtime' && return\n\
         \x20   sleep 0.1\n\
         \x20 done\n\
         }}\n\
         cmstop() {{ kill $cs 2>/dev/null; wait $cs 2>/dev/null; }}\n\
         echo '@@tools phase connection setup'\n"
    );
    for round in 1..=plan.cm_rounds {
        let _ = writeln!(
            s,
            "echo '@@tools round={round}'\n\
             cmsrv; timeout 300 cmtime -s $A -c {CONNS} || fail cmtime; cmstop"
        );
        for layer in LAYERS.iter().chain(&["async"]) {
            let _ = writeln!(
                s,
                "cmsrv; timeout 300 $E/tools_cm --layer {layer} --addr $A:7471 \
                 --connections {CONNS} || fail tools_cm {layer}; cmstop"
            );
        }
    }
    s.push_str("echo '@@tools phase ping-pong'\n");
    let n = plan.iters;
    for round in 1..=plan.lat_rounds {
        let _ = writeln!(s, "echo '@@tools round={round}'");
        let _ = writeln!(s, "isl event -e -s 64 -n {n}");
        for (_, flags, _) in DRIVERS {
            let _ = writeln!(s, "pp --iters {n} --size 64{flags}");
        }
        let _ = writeln!(s, "isl busy -s 64 -n {n}");
        for (_, flags, _) in DRIVERS {
            let _ = writeln!(
                s,
                "pp --iters {n} --size 64 --busy-poll-us {BUSY_POLL_US}{flags}"
            );
        }
    }
    // Instructions per round trip: the difference between a long and a short run of the
    // same client, so that its start-up cancels out.
    s.push_str("echo '@@tools phase instructions'\n");
    for (_, flags, _) in DRIVERS.iter().filter(|d| CG_DRIVERS.contains(&d.0)) {
        for n in CG_ITERS {
            let _ = writeln!(s, "cg {n}{flags}");
        }
    }
    s.push_str("echo '@@tools phase throughput'\n");
    for round in 1..=plan.stream_rounds {
        let _ = writeln!(s, "echo '@@tools round={round}'");
        for (size, count, conns) in STREAMS {
            let count = (count / plan.stream_scale).max(1);
            let q = if *conns > 1 {
                format!(" -q {conns}")
            } else {
                String::new()
            };
            let what = format!("size={size} conns={conns}");
            let run = format!("--size {size} --count {count} --conns {conns}");
            let _ = writeln!(s, "isb 'mode=event {what}' -e -s {size} -n {count}{q}");
            let _ = writeln!(s, "st {run}");
            let _ = writeln!(s, "isb 'mode=busy {what}' -s {size} -n {count}{q}");
            let _ = writeln!(s, "st {run} --busy-poll-us {BUSY_POLL_US}");
        }
        for (size, count, buffers) in ZERO_COPY {
            let count = (count / plan.stream_scale).max(1);
            let _ = writeln!(
                s,
                "isb 'mode=event-zc size={size} conns=1' -e -s {size} -n {count}"
            );
            let _ = writeln!(
                s,
                "st --size {size} --count {count} --conns 1 --zero-copy {buffers}"
            );
        }
    }
    s.push_str("echo '@@tools phase one-sided'\n");
    for round in 1..=plan.remote_rounds {
        let _ = writeln!(s, "echo '@@tools round={round}'");
        for (fig, ours, tool) in REMOTE {
            let n = if fig.contains("-bw-") {
                (REMOTE_BW_OPS / plan.stream_scale).max(1)
            } else {
                REMOTE_LAT_OPS
            };
            let (bin, args) = tool.split_once(' ').unwrap_or((tool, ""));
            let _ = writeln!(s, "perf {bin} 'rem fig={fig}' {args} -n {n}");
            let _ = writeln!(s, "rt {ours} --iters {n}");
        }
    }
    s.push_str("echo '@@tools phase events'\n");
    for round in 1..=plan.event_rounds {
        let _ = writeln!(s, "echo '@@tools round={round}'");
        for layer in ["async", "core"] {
            for c in CHANNELS {
                let _ = writeln!(
                    s,
                    "timeout 240 $E/tools_events --layer {layer} --channels {c} \
                     --connections {EVENT_CONNS} --in-flight {IN_FLIGHT} --addr $A:7480 \
                     || fail tools_events {layer} {c}"
                );
            }
        }
        // Each drain run right after its yardstick, so both see the same load.
        for c in CHANNELS {
            for layer in ["spin", "drain"] {
                let _ = writeln!(
                    s,
                    "timeout 240 $E/tools_events --layer {layer} --channels {c} \
                     --connections {EVENT_CONNS} --rounds {DRAIN_ROUNDS} --addr $A:7480 \
                     || fail tools_events {layer} {c}"
                );
            }
        }
    }
    s.push_str("exit $status\n");
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench_tools::{CHANNELS, DRAIN_ROUNDS, EVENT_LAYERS, STREAMS};

    #[test]
    fn script_runs_every_driver_in_every_ping_pong_round() {
        let plan = plan(2, 1);
        let s = script(Path::new("/x"), &plan);
        let pp: Vec<&str> = s.lines().filter(|l| l.starts_with("pp ")).collect();
        assert_eq!(pp.len(), 20, "{s}");
        for (i, want) in [
            "pp --iters 300 --size 64",
            "pp --iters 300 --size 64 --multi-thread",
            "pp --iters 300 --size 64 --multi-thread --spawn",
            "pp --iters 300 --size 64 --layer core",
            "pp --iters 300 --size 64 --layer core --tokio",
            "pp --iters 300 --size 64 --busy-poll-us 1000",
            "pp --iters 300 --size 64 --busy-poll-us 1000 --multi-thread",
            "pp --iters 300 --size 64 --busy-poll-us 1000 --multi-thread --spawn",
            "pp --iters 300 --size 64 --busy-poll-us 1000 --layer core",
            "pp --iters 300 --size 64 --busy-poll-us 1000 --layer core --tokio",
        ]
        .iter()
        .enumerate()
        {
            assert_eq!(pp[i], *want);
            assert_eq!(pp[i + 10], *want);
        }
        assert_eq!(s.lines().filter(|l| l.starts_with("isl ")).count(), 4);
        let cg: Vec<&str> = s.lines().filter(|l| l.starts_with("cg ")).collect();
        assert_eq!(
            cg,
            [
                "cg 300",
                "cg 1300",
                "cg 300 --multi-thread --spawn",
                "cg 1300 --multi-thread --spawn",
                "cg 300 --layer core --tokio",
                "cg 1300 --layer core --tokio",
            ]
        );
    }

    #[test]
    fn script_is_valid_sh() {
        let path = std::env::temp_dir().join(format!("evchan-tools-{}.sh", std::process::id()));
        std::fs::write(&path, script(Path::new("/x"), &plan(1, 1))).unwrap();
        let out = std::process::Command::new("sh")
            .arg("-n")
            .arg(&path)
            .output()
            .unwrap();
        let _ = std::fs::remove_file(&path);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    fn plan(lat_rounds: u32, stream_rounds: u32) -> Plan {
        Plan {
            cm_rounds: 1,
            lat_rounds,
            iters: 300,
            stream_rounds,
            stream_scale: 2,
            event_rounds: 2,
            remote_rounds: 2,
        }
    }

    #[test]
    fn script_runs_every_stream_after_its_baseline_in_every_round() {
        let s = script(Path::new("/x"), &plan(1, 2));
        let runs: Vec<&str> = s
            .lines()
            .filter(|l| l.starts_with("isb ") || l.starts_with("st "))
            .collect();
        let per_round = 4 * STREAMS.len() + 2 * ZERO_COPY.len();
        assert_eq!(runs.len(), 2 * per_round, "{s}");
        assert_eq!(
            &runs[..4],
            [
                "isb 'mode=event size=64 conns=1' -e -s 64 -n 10000",
                "st --size 64 --count 10000 --conns 1",
                "isb 'mode=busy size=64 conns=1' -s 64 -n 10000",
                "st --size 64 --count 10000 --conns 1 --busy-poll-us 1000",
            ]
        );
        assert!(runs.contains(&"isb 'mode=event size=64 conns=4' -e -s 64 -n 5000 -q 4"));
        let zc = runs.iter().position(|l| l.contains("--zero-copy")).unwrap();
        assert_eq!(
            runs[zc - 1],
            "isb 'mode=event-zc size=65536 conns=1' -e -s 65536 -n 1000"
        );
        assert_eq!(runs[..per_round], runs[per_round..]);
    }

    #[test]
    fn script_runs_every_event_layer_in_every_events_round() {
        let s = script(Path::new("/x"), &plan(1, 1));
        let runs: Vec<&str> = s.lines().filter(|l| l.contains("/tools_events ")).collect();
        assert_eq!(runs.len(), 2 * 4 * CHANNELS.len(), "{s}");
        for layer in EVENT_LAYERS {
            for c in CHANNELS {
                let want = format!("--layer {layer} --channels {c} ");
                assert_eq!(
                    runs.iter().filter(|l| l.contains(&want)).count(),
                    2,
                    "{want}"
                );
            }
        }
        for run in &runs {
            let rounds = run.contains(&format!("--rounds {DRAIN_ROUNDS}"));
            let in_flight = run.contains("--in-flight");
            if run.contains("--layer drain") || run.contains("--layer spin") {
                assert!(rounds && !in_flight, "{run}");
            } else {
                assert!(!rounds && in_flight, "{run}");
            }
        }
    }
}
