//! The calling thread's CPU time, shared by evchan-core's and evchan's device tests (evchan's
//! support includes this file by path).

/// CPU time (user + system) the calling thread has used so far, in clock ticks
/// (`/proc/thread-self/stat`'s `utime` and `stime`; 100 a second on Linux): a wait that sleeps
/// adds next to none, one that spins adds its whole duration.
pub fn thread_cpu_ticks() -> u64 {
    let stat = std::fs::read_to_string("/proc/thread-self/stat").unwrap();
    // The fields after the command name, which is in parentheses and may hold spaces.
    let rest = &stat[stat.rfind(')').unwrap() + 2..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // utime and stime are fields 14 and 15 of the whole line, 12 and 13 of the rest.
    fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap()
}
