//! [`evchan_sys::free_arena_top`] against glibc, natively (no device): what `malloc_trim`
//! leaves in a thread's arena, it gives back.

/// Resident set of this process, in KiB, counted from its page tables (`smaps_rollup`):
/// `VmRSS` in `status` may lag behind a thread's last changes.
fn rss_kib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/smaps_rollup").unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("Rss:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap()
}

/// Small allocations the thread makes and frees: 40,000 of 100 bytes, about 4.6 MiB of
/// chunks, freed into glibc's per-thread cache and fast bins, which never trim the arena.
const SMALL: usize = 40_000;

/// A thread fills its own arena with small allocations and frees them all; `malloc_trim`
/// merges them into the arena's top but leaves that top resident (it trims only the main
/// arena's); `free_arena_top` on that thread gives it back.
#[test]
fn free_arena_top_gives_back_what_malloc_trim_leaves_in_a_threads_arena() {
    // Huge pages would make the resident set move by 2 MiB with nothing allocated.
    evchan_sys::disable_transparent_huge_pages().unwrap();
    let (trimmed, topped) = std::thread::spawn(|| {
        let mut v: Vec<Box<[u8; 100]>> = Vec::with_capacity(SMALL);
        for i in 0..SMALL {
            v.push(Box::new([i as u8; 100]));
        }
        drop(std::hint::black_box(v));
        evchan_sys::malloc_trim();
        let trimmed = rss_kib();
        evchan_sys::free_arena_top();
        (trimmed, rss_kib())
    })
    .join()
    .unwrap();
    eprintln!("after malloc_trim {trimmed} KiB, after free_arena_top {topped} KiB");
    assert!(
        topped + 2048 <= trimmed,
        "free_arena_top gave back {} KiB of the thread's arena (from {trimmed} KiB)",
        trimmed.saturating_sub(topped)
    );
}
