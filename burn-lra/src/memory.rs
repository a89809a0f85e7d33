//! The machine's memory as the processes see it: the allocator setting of training and
//! benchmark processes, and the memory available to them (which the data readers, the memory
//! check and the benchmarks read). Nothing here imports another module of the harness.

/// Makes the C allocator keep freed memory for reuse instead of handing it back to the kernel.
///
/// Attention tensors are large (an `n × n` score matrix per head is 64 MiB at n = 4096) and
/// short-lived. glibc serves each such request with a fresh `mmap` and unmaps it on free, so
/// every step pays for the kernel zeroing the same pages again: profiled with `perf` on the
/// softmax benchmark at n = 2048, page clearing and faults took a third of the time. So large
/// requests are served from the heap (`M_MMAP_MAX` 0), the heap is never trimmed
/// (`M_TRIM_THRESHOLD` -1: a finite threshold returns the heap's free top once it grows past it,
/// and a `small` training step at 2K frees more than 2 GiB at once), and every thread allocates
/// from that one heap (`M_ARENA_MAX` 1: the worker threads' arenas are `mmap`ed heaps of at most
/// 64 MiB, unmapped whenever one is wholly free). The cost: the process's resident size stays near
/// its peak between steps instead of falling back.
///
/// Call it first thing in `main`, before other threads start. A no-op off Linux/glibc.
pub fn keep_freed_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: `mallopt` only changes allocator tuning parameters; called before any other
    // thread exists, so no allocation is in flight.
    unsafe {
        libc::mallopt(libc::M_MMAP_MAX, 0);
        libc::mallopt(libc::M_TRIM_THRESHOLD, -1);
        libc::mallopt(libc::M_ARENA_MAX, 1);
    }
}

/// The memory the kernel can give this process without swapping (`MemAvailable`), in bytes.
pub fn available_memory() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = text.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}
