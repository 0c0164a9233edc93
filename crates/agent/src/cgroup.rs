//! Finds the host's cgroup controllers (v1, v2 or both mounted) and gives containers their limits.
//!
//! Detection reads `/proc/self/mountinfo` instead of assuming a layout: a controller is used
//! through its v1 hierarchy when one is mounted, else through the unified (v2) hierarchy when
//! that lists it in `cgroup.controllers`, else not at all (the limit is skipped, with a warning).

use std::fs;
use std::path::{Path, PathBuf};

use tracing::{info, warn};

#[derive(Debug, Clone)]
enum Hierarchy {
    V1(PathBuf),
    V2(PathBuf),
}

/// The controllers this host lets the agent use.
#[derive(Debug, Clone, Default)]
pub(crate) struct Cgroups {
    memory: Option<Hierarchy>,
    cpu: Option<Hierarchy>,
    /// v1 only: where CPU time is counted (`cpuacct.usage`); v2 counts it in every cgroup's `cpu.stat`.
    cpuacct: Option<Hierarchy>,
    pids: Option<Hierarchy>,
    /// The unified hierarchy's mount, if any (for reading usage from a v2 path).
    unified: Option<PathBuf>,
}

/// The cgroups made for one container instance.
#[derive(Debug, Clone, Default)]
pub(crate) struct ContainerCgroups {
    /// `cgroup.procs` of each; the container's process writes `0` to each before it executes.
    pub procs_files: Vec<PathBuf>,
    pub dirs: Vec<PathBuf>,
    /// Where the kernel counts OOM kills for the memory cgroup (v1 `memory.oom_control`, v2 `memory.events`).
    pub oom_file: Option<PathBuf>,
}

/// Limits for one container.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Limits {
    pub memory_bytes: Option<u64>,
    pub cpu_millis: Option<u64>,
    pub pids: Option<u64>,
}

const GROUP: &str = "shepherd";

/// What to write into a memory cgroup to hold it to `bytes`.
fn memory_files(h: &Hierarchy, bytes: Option<u64>) -> Vec<(&'static str, String)> {
    match (h, bytes) {
        (_, None) => vec![],
        (Hierarchy::V1(_), Some(bytes)) => vec![("memory.limit_in_bytes", bytes.to_string())],
        (Hierarchy::V2(_), Some(bytes)) => vec![("memory.max", bytes.to_string()), ("memory.swap.max", "0".into())],
    }
}

/// The CFS period the quota is given for, in microseconds (Kubernetes' default).
pub(crate) const CPU_PERIOD_US: u64 = 100_000;
/// The kernel refuses a quota below 1 ms a period (`1m` CPU is held to 10m, as in Kubernetes)...
const MIN_QUOTA_US: u64 = 1000;
/// ...and above 2^44 - 1 us a period (`max_cfs_runtime`): 175,921,860 CPUs, more than any host has.
const MAX_QUOTA_US: u64 = (1 << 44) - 1;

/// The quota, in microseconds per [`CPU_PERIOD_US`], that holds a container to `millis` thousandths
/// of a CPU; `None` (no quota) for a limit past the kernel's largest quota, which cannot hold any
/// host back (and past `u64` would wrap around). Both runtimes use it: runc passes the quota on.
pub(crate) fn cpu_quota_us(millis: u64) -> Option<u64> {
    match millis.checked_mul(CPU_PERIOD_US / 1000) {
        Some(q) if q <= MAX_QUOTA_US => Some(q.max(MIN_QUOTA_US)),
        _ => None,
    }
}

/// What to write into a cpu cgroup to hold it to `millis` thousandths of a CPU. A limit past the
/// kernel's largest quota cannot hold any host back, so it is written as no quota at all instead of
/// a value the kernel would refuse (or, past `u64`, one that wrapped around).
fn cpu_files(h: &Hierarchy, millis: Option<u64>) -> Vec<(&'static str, String)> {
    let quota = millis.map(cpu_quota_us);
    match (h, quota) {
        (_, None) => vec![],
        (Hierarchy::V1(_), Some(q)) => vec![
            ("cpu.cfs_period_us", CPU_PERIOD_US.to_string()),
            ("cpu.cfs_quota_us", q.map_or_else(|| "-1".into(), |q| q.to_string())),
        ],
        (Hierarchy::V2(_), Some(q)) => {
            vec![("cpu.max", format!("{} {CPU_PERIOD_US}", q.map_or_else(|| "max".into(), |q| q.to_string())))]
        }
    }
}

/// A hierarchy, the files to write in the container's cgroup there, and the controller's name.
type Setting<'a> = (&'a Hierarchy, Vec<(&'static str, String)>, &'static str);

impl Cgroups {
    /// Reads the mount table; an unreadable one means no cgroups.
    pub fn detect() -> Cgroups {
        let Ok(mountinfo) = fs::read_to_string("/proc/self/mountinfo") else {
            warn!("cannot read /proc/self/mountinfo: running containers without cgroup limits");
            return Cgroups::default();
        };
        let found = Cgroups::from_mountinfo(&mountinfo, |root| fs::read_to_string(root.join("cgroup.controllers")).ok());
        info!(memory = ?found.memory, cpu = ?found.cpu, pids = ?found.pids, "cgroup controllers found");
        found
    }

    fn from_mountinfo(mountinfo: &str, v2_controllers: impl Fn(&Path) -> Option<String>) -> Cgroups {
        let mut v1: Vec<(PathBuf, Vec<String>)> = Vec::new();
        let mut v2: Option<PathBuf> = None;
        for line in mountinfo.lines() {
            let Some((left, right)) = line.split_once(" - ") else { continue };
            let Some(mount_point) = left.split(' ').nth(4) else { continue };
            let mut r = right.split(' ');
            let (fstype, _source, options) = (r.next(), r.next(), r.next().unwrap_or(""));
            match fstype {
                Some("cgroup") => v1.push((PathBuf::from(mount_point), options.split(',').map(str::to_string).collect())),
                Some("cgroup2") => v2 = Some(PathBuf::from(mount_point)),
                _ => {}
            }
        }
        let v2_list: Vec<String> = v2
            .as_deref()
            .and_then(&v2_controllers)
            .map(|s| s.split_whitespace().map(str::to_string).collect())
            .unwrap_or_default();
        let pick = |name: &str| -> Option<Hierarchy> {
            if let Some((mount, _)) = v1.iter().find(|(_, opts)| opts.iter().any(|o| o == name)) {
                return Some(Hierarchy::V1(mount.clone()));
            }
            match &v2 {
                Some(root) if v2_list.iter().any(|c| c == name) => Some(Hierarchy::V2(root.clone())),
                _ => None,
            }
        };
        let cpuacct = v1.iter().find(|(_, opts)| opts.iter().any(|o| o == "cpuacct")).map(|(m, _)| Hierarchy::V1(m.clone()));
        Cgroups { memory: pick("memory"), cpu: pick("cpu"), cpuacct, pids: pick("pids"), unified: v2 }
    }

    pub fn has_memory(&self) -> bool {
        self.memory.is_some()
    }

    /// Creates the cgroups of `name` with `limits`. Failures are logged and that limit skipped.
    /// Memory, cpu and cpuacct cgroups are made even without a limit: the container's usage is
    /// read from them (`usage_of_pid`).
    pub fn create(&self, name: &str, limits: Limits) -> ContainerCgroups {
        let mut out = ContainerCgroups::default();
        let mut settings: Vec<Setting<'_>> = Vec::new();
        if let Some(h) = &self.memory {
            settings.push((h, memory_files(h, limits.memory_bytes), "memory"));
        }
        if let Some(h) = &self.cpu {
            settings.push((h, cpu_files(h, limits.cpu_millis), "cpu"));
        }
        if let Some(h) = &self.cpuacct {
            settings.push((h, vec![], "cpuacct"));
        }
        if let (Some(h), Some(pids)) = (&self.pids, limits.pids) {
            settings.push((h, vec![("pids.max", pids.to_string())], "pids"));
        }
        let mut v2_dir: Option<PathBuf> = None;
        for (h, files, controller) in settings {
            let dir = match h {
                Hierarchy::V1(mount) => mount.join(GROUP).join(name),
                Hierarchy::V2(root) => {
                    let _ = fs::create_dir_all(root.join(GROUP));
                    let _ = fs::write(root.join("cgroup.subtree_control"), format!("+{controller}"));
                    let _ = fs::write(root.join(GROUP).join("cgroup.subtree_control"), format!("+{controller}"));
                    root.join(GROUP).join(name)
                }
            };
            if let Err(e) = fs::create_dir_all(&dir) {
                warn!(cgroup = %dir.display(), error = %e, "cannot create cgroup; skipping the {controller} limit");
                continue;
            }
            for (file, value) in files {
                if let Err(e) = fs::write(dir.join(file), &value) {
                    warn!(cgroup = %dir.display(), file, error = %e, "cannot set cgroup limit");
                }
            }
            if controller == "memory" {
                out.oom_file = Some(match h {
                    Hierarchy::V1(_) => dir.join("memory.oom_control"),
                    Hierarchy::V2(_) => dir.join("memory.events"),
                });
            }
            match h {
                Hierarchy::V2(_) if v2_dir.as_ref() == Some(&dir) => {}
                Hierarchy::V2(_) => {
                    v2_dir = Some(dir.clone());
                    out.procs_files.push(dir.join("cgroup.procs"));
                    out.dirs.push(dir);
                }
                // A controller mounted with another (`cpu,cpuacct`) shares its directory.
                Hierarchy::V1(_) if out.dirs.contains(&dir) => {}
                Hierarchy::V1(_) => {
                    out.procs_files.push(dir.join("cgroup.procs"));
                    out.dirs.push(dir);
                }
            }
        }
        out
    }

    /// Removes empty container cgroups whose name `keep` rejects (left by a removal that could
    /// not finish before the previous agent stopped).
    pub fn remove_stale(&self, keep: impl Fn(&str) -> bool) {
        for h in [&self.memory, &self.cpu, &self.cpuacct, &self.pids].into_iter().flatten() {
            let (Hierarchy::V1(m) | Hierarchy::V2(m)) = h;
            let Ok(entries) = fs::read_dir(m.join(GROUP)) else { continue };
            for e in entries.flatten() {
                let name = e.file_name().to_string_lossy().to_string();
                if e.path().is_dir() && !keep(&name) {
                    let _ = fs::remove_dir(e.path());
                }
            }
        }
    }

    /// Where the kernel counts OOM kills of the memory cgroup at `path` (relative to the
    /// hierarchy's root, as runc's `cgroupsPath`), if the host has a memory controller.
    pub fn oom_file_of(&self, path: &str) -> Option<PathBuf> {
        let rel = path.trim_start_matches('/');
        match self.memory.as_ref()? {
            Hierarchy::V1(m) => Some(m.join(rel).join("memory.oom_control")),
            Hierarchy::V2(r) => Some(r.join(rel).join("memory.events")),
        }
    }

    /// The cgroup directories `create` would make for `name` (to clean up after a restart).
    pub fn dirs_of(&self, name: &str) -> Vec<PathBuf> {
        let mut dirs: Vec<PathBuf> = Vec::new();
        for h in [&self.memory, &self.cpu, &self.cpuacct, &self.pids].into_iter().flatten() {
            let (Hierarchy::V1(m) | Hierarchy::V2(m)) = h;
            let dir = m.join(GROUP).join(name);
            if !dirs.contains(&dir) {
                dirs.push(dir);
            }
        }
        dirs
    }

    /// The CPU time and memory working set of the cgroups process `pid` is in, from
    /// `/proc/<pid>/cgroup`: for v1 `cpuacct.usage` and `memory.usage_in_bytes`, for v2
    /// `cpu.stat`'s `usage_usec` and `memory.current`, less the inactive file cache (what kubelet
    /// and cAdvisor call the working set). `None` for a value whose cgroup is the agent's own
    /// (the container has none of its own: its usage cannot be told apart).
    pub fn usage_of_pid(&self, pid: u32) -> CgroupUsage {
        let (Ok(theirs), Ok(ours)) =
            (fs::read_to_string(format!("/proc/{pid}/cgroup")), fs::read_to_string("/proc/self/cgroup"))
        else {
            return CgroupUsage::default();
        };
        let own = |controller: Option<&str>| -> Option<String> {
            let path = cgroup_path(&theirs, controller)?;
            (cgroup_path(&ours, controller).as_deref() != Some(path.as_str())).then_some(path)
        };
        let under = |root: &Path, path: &str| root.join(path.trim_start_matches('/'));
        let cpu_ns = match (&self.cpuacct, &self.unified) {
            (Some(Hierarchy::V1(m)), _) => own(Some("cpuacct"))
                .and_then(|p| fs::read_to_string(under(m, &p).join("cpuacct.usage")).ok())
                .and_then(|s| s.trim().parse::<u64>().ok()),
            (_, Some(root)) => own(None)
                .and_then(|p| fs::read_to_string(under(root, &p).join("cpu.stat")).ok())
                .and_then(|s| stat_value(&s, "usage_usec"))
                .map(|us| us.saturating_mul(1000)),
            _ => None,
        };
        let memory_bytes = match &self.memory {
            Some(Hierarchy::V1(m)) => own(Some("memory")).and_then(|p| {
                let dir = under(m, &p);
                let usage = fs::read_to_string(dir.join("memory.usage_in_bytes")).ok()?.trim().parse::<u64>().ok()?;
                let stat = fs::read_to_string(dir.join("memory.stat")).unwrap_or_default();
                Some(usage.saturating_sub(stat_value(&stat, "total_inactive_file").unwrap_or(0)))
            }),
            Some(Hierarchy::V2(root)) => own(None).and_then(|p| {
                let dir = under(root, &p);
                let usage = fs::read_to_string(dir.join("memory.current")).ok()?.trim().parse::<u64>().ok()?;
                let stat = fs::read_to_string(dir.join("memory.stat")).unwrap_or_default();
                Some(usage.saturating_sub(stat_value(&stat, "inactive_file").unwrap_or(0)))
            }),
            None => None,
        };
        CgroupUsage { cpu_ns, memory_bytes }
    }
}

/// What a container's cgroups say it used; a value its cgroups cannot give is `None`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct CgroupUsage {
    /// CPU time since the cgroup was made, in nanoseconds.
    pub cpu_ns: Option<u64>,
    pub memory_bytes: Option<u64>,
}

/// The path of a `/proc/<pid>/cgroup` listing in the v1 hierarchy holding `controller`, or in the
/// unified hierarchy for `None`.
fn cgroup_path(listing: &str, controller: Option<&str>) -> Option<String> {
    listing.lines().find_map(|line| {
        let mut parts = line.splitn(3, ':');
        let (id, controllers, path) = (parts.next()?, parts.next()?, parts.next()?);
        let hit = match controller {
            Some(c) => controllers.split(',').any(|x| x == c),
            None => id == "0" && controllers.is_empty(),
        };
        hit.then(|| path.to_string())
    })
}

/// `key N` from a flat-keyed cgroup file (`memory.stat`, `cpu.stat`).
fn stat_value(text: &str, key: &str) -> Option<u64> {
    text.lines().find_map(|l| l.strip_prefix(key)?.strip_prefix(' ')?.trim().parse().ok())
}

/// How many OOM kills the kernel counted in a memory cgroup (`oom_kill N` in either file format).
pub(crate) fn oom_kills(oom_file: &Path) -> u64 {
    fs::read_to_string(oom_file)
        .ok()
        .and_then(|s| {
            s.lines().find_map(|l| l.strip_prefix("oom_kill ").and_then(|n| n.trim().parse().ok()))
        })
        .unwrap_or(0)
}

/// Removes a container's cgroup directories once their last process is gone: the rest of a PID
/// namespace is killed only as its PID 1 exits, so they may stay busy for a moment.
pub(crate) async fn remove_dirs_when_empty(dirs: Vec<PathBuf>) {
    for _ in 0..50 {
        let busy = dirs.iter().any(|d| d.exists() && fs::remove_dir(d).is_err());
        if !busy {
            return;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    remove_dirs(&dirs);
}

/// Removes a container's cgroup directories (only possible once they hold no process).
pub(crate) fn remove_dirs(dirs: &[PathBuf]) {
    for d in dirs {
        if d.exists()
            && let Err(e) = fs::remove_dir(d)
        {
            warn!(cgroup = %d.display(), error = %e, "cannot remove cgroup");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{Value, json};

    /// The cgroup v2 files a container with these limits gets, after the API server accepted its pod.
    fn v2_files_for(limits: Value) -> Vec<(&'static str, String)> {
        let pod = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": "default"},
            "spec": {"containers": [{"name": "c", "image": "busybox", "resources": {"limits": limits}}]}});
        let res = shepherd_api::kinds::by_kind("Pod").expect("pods are a kind");
        shepherd_api::validation::validate(res, &pod).expect("the API accepts these limits");
        let (memory, cpu) = crate::quantity::limits(&pod["spec"]["containers"][0]);
        let h = Hierarchy::V2(PathBuf::from("/sys/fs/cgroup"));
        [memory_files(&h, memory), cpu_files(&h, cpu)].concat()
    }

    fn file(files: &[(&'static str, String)], name: &str) -> String {
        files.iter().find(|(f, _)| *f == name).map(|(_, v)| v.clone()).unwrap_or_else(|| panic!("no {name} in {files:?}"))
    }

    #[test]
    fn every_memory_limit_the_api_accepts_is_written_to_the_byte() {
        for (limit, bytes) in [
            (json!("1e9"), "1000000000"),
            (json!("1.5Gi"), "1610612736"),
            (json!("500M"), "500000000"),
            (json!("0.5"), "1"),
            (json!("100m"), "1"),
            (json!("1Ei"), "1152921504606846976"),
            (json!("7E"), "7000000000000000000"),
            (json!("3Ki"), "3072"),
            (json!(1048576), "1048576"),
        ] {
            let files = v2_files_for(json!({"memory": limit}));
            assert_eq!(file(&files, "memory.max"), bytes, "memory limit {limit}");
        }
    }

    #[test]
    fn every_cpu_limit_the_api_accepts_is_a_quota_the_kernel_takes() {
        for (limit, max) in [
            (json!("100m"), "10000 100000"),
            (json!("1.5"), "150000 100000"),
            (json!("0.0001"), "1000 100000"),
            (json!("1u"), "1000 100000"),
            (json!(2), "200000 100000"),
            (json!("1k"), "100000000 100000"),
            (json!("175M"), "17500000000000 100000"),
            // Past the kernel's largest quota (2^44 - 1 us a period) no host is held back: unlimited.
            (json!("176M"), "max 100000"),
            (json!("1P"), "max 100000"),
            (json!("9P"), "max 100000"),
        ] {
            let files = v2_files_for(json!({"cpu": limit}));
            assert_eq!(file(&files, "cpu.max"), max, "cpu limit {limit}");
        }
        let v1 = cpu_files(&Hierarchy::V1(PathBuf::from("/sys/fs/cgroup/cpu")), Some(1_000_000_000_000_000_000));
        assert_eq!(file(&v1, "cpu.cfs_quota_us"), "-1", "unlimited in v1 terms");
        assert_eq!(file(&v1, "cpu.cfs_period_us"), "100000");
    }

    const HYBRID: &str = "\
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
";

    #[test]
    fn a_hybrid_host_uses_v1_controllers_where_they_are_mounted_and_v2_for_the_rest() {
        let c = Cgroups::from_mountinfo(HYBRID, |_| Some("pids".into()));
        assert!(matches!(c.memory, Some(Hierarchy::V1(ref p)) if p == Path::new("/sys/fs/cgroup/memory")));
        assert!(matches!(c.cpu, Some(Hierarchy::V1(_))));
        assert!(matches!(c.pids, Some(Hierarchy::V2(ref p)) if p == Path::new("/sys/fs/cgroup/unified")));
    }

    #[test]
    fn a_v2_only_host_without_delegated_controllers_gets_no_limits() {
        let only_v2 = "41 23 0:38 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n";
        let c = Cgroups::from_mountinfo(only_v2, |_| Some(String::new()));
        assert!(c.memory.is_none() && c.cpu.is_none() && c.pids.is_none());
        let c = Cgroups::from_mountinfo(only_v2, |_| Some("cpu memory pids".into()));
        assert!(matches!(c.memory, Some(Hierarchy::V2(_))));
    }

    #[test]
    fn a_process_cgroup_listing_names_each_hierarchy_s_path() {
        let listing = "12:pids:/shepherd/u_c\n4:cpuacct:/shepherd/u_c\n3:cpu,cpuacct2:/x\n1:name=systemd:/user.slice\n0::/shepherd/u_c\n";
        assert_eq!(cgroup_path(listing, Some("cpuacct")).as_deref(), Some("/shepherd/u_c"));
        assert_eq!(cgroup_path(listing, Some("cpu")).as_deref(), Some("/x"));
        assert_eq!(cgroup_path(listing, None).as_deref(), Some("/shepherd/u_c"));
        assert_eq!(cgroup_path(listing, Some("memory")), None);
        assert_eq!(stat_value("cache 5\ntotal_inactive_file 4096\n", "total_inactive_file"), Some(4096));
        assert_eq!(stat_value("usage_usec 12\nuser_usec 10\n", "usage_usec"), Some(12));
        assert_eq!(stat_value("inactive_file_x 1\n", "inactive_file"), None);
    }

    #[test]
    fn oom_kills_are_read_from_either_file_format() {
        let dir = tempfile::tempdir().expect("tempdir");
        let f = dir.path().join("memory.oom_control");
        fs::write(&f, "oom_kill_disable 0\nunder_oom 0\noom_kill 2\n").expect("write");
        assert_eq!(oom_kills(&f), 2);
        fs::write(&f, "low 0\nhigh 0\nmax 3\noom 1\noom_kill 1\n").expect("write");
        assert_eq!(oom_kills(&f), 1);
        assert_eq!(oom_kills(&dir.path().join("missing")), 0);
    }
}
