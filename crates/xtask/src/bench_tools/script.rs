//! The guest's shell script of the tools run: what runs in which round, and the marker lines
//! that tell the parser what the next lines are.

use std::fmt::Write as _;
use std::path::Path;

use super::{
    Plan, ADDR, BUSY_POLL_US, CHANNELS, CONNS, DRAIN_ROUNDS, DRIVERS, EVENT_CONNS, IN_FLIGHT,
    LAYERS,
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
         # ib_send_lat: server in the background, client retried while nobody listens yet.\n\
         isl() {{\n\
         \x20 mode=$1; shift\n\
         \x20 for try in 1 2 3 4 5 6 7 8 9 10; do\n\
         \x20   timeout 300 ib_send_lat -R \"$@\" -F >/dev/null 2>&1 & s=$!\n\
         \x20   sleep 1\n\
         \x20   out=$(timeout 300 ib_send_lat -R \"$@\" -F $A 2>&1); rc=$?\n\
         \x20   kill $s 2>/dev/null; wait $s 2>/dev/null\n\
         \x20   if [ $rc = 0 ]; then echo \"@@tools isl mode=$mode\"; echo \"$out\"; return; fi\n\
         \x20 done\n\
         \x20 echo \"$out\"; fail \"ib_send_lat $mode\"\n\
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
    use crate::bench_tools::{CHANNELS, DRAIN_ROUNDS, EVENT_LAYERS};

    #[test]
    fn script_runs_every_driver_in_every_ping_pong_round() {
        let plan = Plan {
            cm_rounds: 1,
            lat_rounds: 2,
            iters: 300,
            event_rounds: 1,
        };
        let s = script(Path::new("/x"), &plan);
        let pp: Vec<&str> = s.lines().filter(|l| l.starts_with("pp ")).collect();
        assert_eq!(pp.len(), 24, "{s}");
        for (i, want) in [
            "pp --iters 300 --size 64",
            "pp --iters 300 --size 64 --in-task",
            "pp --iters 300 --size 64 --in-task --spawn",
            "pp --iters 300 --size 64 --layer core",
            "pp --iters 300 --size 64 --layer core --tokio",
            "pp --iters 300 --size 64 --layer local",
            "pp --iters 300 --size 64 --busy-poll-us 1000",
            "pp --iters 300 --size 64 --busy-poll-us 1000 --in-task",
            "pp --iters 300 --size 64 --busy-poll-us 1000 --in-task --spawn",
            "pp --iters 300 --size 64 --busy-poll-us 1000 --layer core",
            "pp --iters 300 --size 64 --busy-poll-us 1000 --layer core --tokio",
            "pp --iters 300 --size 64 --busy-poll-us 1000 --layer local",
        ]
        .iter()
        .enumerate()
        {
            assert_eq!(pp[i], *want);
            assert_eq!(pp[i + 12], *want);
        }
        assert_eq!(s.lines().filter(|l| l.starts_with("isl ")).count(), 4);
    }

    #[test]
    fn script_runs_every_event_layer_in_every_events_round() {
        let plan = Plan {
            cm_rounds: 1,
            lat_rounds: 1,
            iters: 300,
            event_rounds: 2,
        };
        let s = script(Path::new("/x"), &plan);
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
