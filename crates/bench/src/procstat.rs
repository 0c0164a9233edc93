//! CPU time, memory and load of processes, read from /proc (Linux).

/// Clock ticks per second of /proc's CPU times; 100 on every Linux build we target.
const TICKS_PER_SECOND: f64 = 100.0;

/// User + system CPU seconds consumed so far by process `pid` ("self" for this one).
pub fn cpu_seconds(pid: &str) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // Fields after the parenthesised command name, which may itself contain spaces.
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| fields.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    // utime and stime are fields 14 and 15 of the stat line; 11 and 12 after the name.
    (ticks(11) + ticks(12)) / TICKS_PER_SECOND
}

/// A `VmRSS` / `VmHWM` style field of /proc/<pid>/status, in MiB.
fn status_mib(pid: &str, field: &str) -> f64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find(|l| l.starts_with(field))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse::<f64>().ok())
        .map_or(0.0, |kib| kib / 1024.0)
}

pub fn rss_mib(pid: &str) -> f64 {
    status_mib(pid, "VmRSS:")
}

/// Peak resident set size since the process started.
pub fn peak_rss_mib(pid: &str) -> f64 {
    status_mib(pid, "VmHWM:")
}

/// The 1-minute load average: how busy the (shared) machine was around a measurement.
pub fn load_average() -> f64 {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|s| s.split_whitespace().next().and_then(|v| v.parse().ok()))
        .unwrap_or(0.0)
}

/// Open file descriptors of process `pid`.
pub fn open_fds(pid: &str) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd")).map(|d| d.count()).unwrap_or(0)
}

/// Threads of process `pid`.
pub fn threads(pid: &str) -> usize {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status.lines().find_map(|l| l.strip_prefix("Threads:")?.trim().parse().ok()).unwrap_or(0)
}

/// Processes descended from `pid` (its containers and their shims), not counting itself.
pub fn descendants(pid: u32) -> usize {
    let mut parent_of = std::collections::HashMap::new();
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Some(p) = entry.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else { continue };
        let stat = std::fs::read_to_string(entry.path().join("stat")).unwrap_or_default();
        // The parent pid is the second field after the parenthesised command name.
        let ppid = stat.rsplit_once(')').and_then(|(_, r)| r.split_whitespace().nth(1)?.parse::<u32>().ok());
        if let Some(ppid) = ppid {
            parent_of.insert(p, ppid);
        }
    }
    parent_of
        .keys()
        .filter(|p| {
            let mut cur = **p;
            for _ in 0..64 {
                match parent_of.get(&cur) {
                    Some(&pp) if pp == pid => return true,
                    Some(&pp) if pp > 1 => cur = pp,
                    _ => return false,
                }
            }
            false
        })
        .count()
}

/// Bytes of the regular files under `dir`.
pub fn dir_bytes(dir: &std::path::Path) -> u64 {
    let mut total = 0;
    let mut stack = vec![dir.to_path_buf()];
    while let Some(p) = stack.pop() {
        let Ok(meta) = std::fs::symlink_metadata(&p) else { continue };
        if meta.is_dir() {
            stack.extend(std::fs::read_dir(&p).into_iter().flatten().flatten().map(|e| e.path()));
        } else if meta.is_file() {
            total += meta.len();
        }
    }
    total
}
