//! The OCI runtime spec (`config.json`) of one container: the image's defaults merged with the pod's
//! container by Kubernetes' rules, the pod sandbox's namespaces, mounts and cgroup limits.

use std::collections::HashSet;
use std::fs;
use std::path::{Path, PathBuf};

use oci_spec::runtime::{
    Capability, LinuxBuilder, LinuxCapabilitiesBuilder, LinuxCpuBuilder, LinuxMemoryBuilder, LinuxNamespaceBuilder,
    LinuxNamespaceType, LinuxPidsBuilder, LinuxResourcesBuilder, Mount, MountBuilder, ProcessBuilder, RootBuilder,
    Spec, UserBuilder, get_default_maskedpaths, get_default_mounts, get_default_readonly_paths,
};

use crate::cgroup;
use crate::runtime::{ContainerSpec, Security};

const DEFAULT_PATH: &str = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// What the image's config says about running it (all optional in an image).
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct ImageDefaults {
    pub entrypoint: Vec<String>,
    pub cmd: Vec<String>,
    pub env: Vec<String>,
    pub working_dir: Option<String>,
    pub user: Option<String>,
}

impl ImageDefaults {
    pub fn from_config(config: &oci_spec::image::ImageConfiguration) -> Self {
        let Some(c) = config.config() else { return ImageDefaults::default() };
        ImageDefaults {
            entrypoint: c.entrypoint().clone().unwrap_or_default(),
            cmd: c.cmd().clone().unwrap_or_default(),
            env: c.env().clone().unwrap_or_default(),
            working_dir: c.working_dir().clone().filter(|w| !w.is_empty()),
            user: c.user().clone().filter(|u| !u.is_empty()),
        }
    }
}

/// Kubernetes' rule: `command` replaces the image's Entrypoint and drops its Cmd; `args` alone
/// replace only the Cmd; neither keeps both.
pub(crate) fn argv(image: &ImageDefaults, command: &[String], args: &[String]) -> Vec<String> {
    match (command.is_empty(), args.is_empty()) {
        (false, _) => command.iter().chain(args).cloned().collect(),
        (true, false) => image.entrypoint.iter().chain(args).cloned().collect(),
        (true, true) => image.entrypoint.iter().chain(&image.cmd).cloned().collect(),
    }
}

/// The image's environment with the container's on top (a name set by both takes the
/// container's value, in the image's position), `PATH` defaulted, `HOSTNAME` set as runtimes do.
pub(crate) fn env(image: &ImageDefaults, container: &[(String, String)], hostname: &str) -> Vec<String> {
    let mut out: Vec<(String, String)> = Vec::new();
    let mut set = |k: &str, v: &str| match out.iter_mut().find(|(name, _)| name == k) {
        Some(slot) => slot.1 = v.to_string(),
        None => out.push((k.to_string(), v.to_string())),
    };
    set("PATH", &DEFAULT_PATH["PATH=".len()..]);
    set("HOSTNAME", hostname);
    for e in &image.env {
        let (k, v) = e.split_once('=').unwrap_or((e, ""));
        set(k, v);
    }
    for (k, v) in container {
        set(k, v);
    }
    out.into_iter().map(|(k, v)| format!("{k}={v}")).collect()
}

/// A container on a terminal gets `TERM=xterm` unless its image or spec sets one, as CRI
/// runtimes do (without it, shells and editors fall back to a dumb terminal).
fn terminal_env(mut env: Vec<String>, tty: bool) -> Vec<String> {
    if tty && !env.iter().any(|e| e.starts_with("TERM=")) {
        env.push("TERM=xterm".into());
    }
    env
}

/// Resolves an image's `User` (`uid`, `uid:gid`, `name`, `name:group`) against the root's
/// `/etc/passwd` and `/etc/group`; a user without a group takes its passwd group (0 if unknown).
pub(crate) fn resolve_user(user: Option<&str>, rootfs: &Path) -> Result<(u32, u32), String> {
    let Some(user) = user.filter(|u| !u.is_empty()) else { return Ok((0, 0)) };
    let (u, g) = match user.split_once(':') {
        Some((u, g)) => (u, Some(g)),
        None => (user, None),
    };
    let passwd = fs::read_to_string(rootfs.join("etc/passwd")).unwrap_or_default();
    let entry = |pred: &dyn Fn(&[&str]) -> bool| -> Option<(u32, u32)> {
        passwd.lines().map(|l| l.split(':').collect::<Vec<_>>()).find(|f| f.len() >= 4 && pred(f)).and_then(|f| {
            Some((f[2].parse().ok()?, f[3].parse().ok()?))
        })
    };
    let (uid, passwd_gid) = match u.parse::<u32>() {
        Ok(uid) => (uid, entry(&|f| f[2] == u).map_or(0, |(_, g)| g)),
        Err(_) => entry(&|f| f[0] == u).ok_or_else(|| format!("user {u:?} of the image is not in its /etc/passwd"))?,
    };
    let gid = match g {
        None => passwd_gid,
        Some(g) => match g.parse::<u32>() {
            Ok(gid) => gid,
            Err(_) => fs::read_to_string(rootfs.join("etc/group"))
                .unwrap_or_default()
                .lines()
                .map(|l| l.split(':').collect::<Vec<_>>())
                .find(|f| f.len() >= 3 && f[0] == g)
                .and_then(|f| f[2].parse().ok())
                .ok_or_else(|| format!("group {g:?} of the image is not in its /etc/group"))?,
        },
    };
    Ok((uid, gid))
}

/// Where a container's pod sandbox keeps what its containers share.
#[derive(Debug, Clone)]
pub(crate) struct SandboxPaths {
    pub ipc: PathBuf,
    pub uts: PathBuf,
    /// `None`: the host's network namespace (until pods get their own).
    pub net: Option<PathBuf>,
    pub hosts: PathBuf,
    pub hostname: PathBuf,
    pub resolv_conf: PathBuf,
}

/// Everything `build` needs besides the container spec.
pub(crate) struct SpecInputs<'a> {
    pub rootfs: &'a Path,
    /// Bind the host's `/` (not its submounts) over the empty `rootfs`, inside the container's
    /// mount namespace only (the built-in `minimal` image).
    pub host_root: bool,
    pub readonly_root: bool,
    pub image: &'a ImageDefaults,
    pub sandbox: &'a SandboxPaths,
    pub cgroups_path: String,
    pub pids_limit: Option<u64>,
}

/// Every capability, for `privileged` and `add: [ALL]`.
fn all_capabilities() -> HashSet<Capability> {
    use Capability::*;
    [
        AuditControl, AuditRead, AuditWrite, BlockSuspend, Bpf, CheckpointRestore, Chown, DacOverride, DacReadSearch,
        Fowner, Fsetid, IpcLock, IpcOwner, Kill, Lease, LinuxImmutable, MacAdmin, MacOverride, Mknod, NetAdmin,
        NetBindService, NetBroadcast, NetRaw, Perfmon, Setgid, Setfcap, Setpcap, Setuid, SysAdmin, SysBoot, SysChroot,
        SysModule, SysNice, SysPacct, SysPtrace, SysRawio, SysResource, SysTime, SysTtyConfig, Syslog, WakeAlarm,
    ]
    .into_iter()
    .collect()
}

fn capability(name: &str) -> Result<Capability, String> {
    let upper = name.to_ascii_uppercase();
    let full = if upper.starts_with("CAP_") { upper } else { format!("CAP_{upper}") };
    serde_json::from_value(serde_json::Value::String(full))
        .map_err(|_| format!("securityContext.capabilities: unknown capability {name:?}"))
}

/// containerd's defaults, then `privileged`, `drop` and `add` as Kubernetes applies them.
pub(crate) fn capabilities(security: &Security) -> Result<HashSet<Capability>, String> {
    if security.privileged {
        return Ok(all_capabilities());
    }
    let mut caps = default_capabilities();
    for name in &security.cap_drop {
        if name.eq_ignore_ascii_case("ALL") {
            caps.clear();
        } else {
            caps.remove(&capability(name)?);
        }
    }
    for name in &security.cap_add {
        if name.eq_ignore_ascii_case("ALL") {
            caps.extend(all_capabilities());
        } else {
            caps.insert(capability(name)?);
        }
    }
    Ok(caps)
}

/// containerd's default capability set for containers.
fn default_capabilities() -> HashSet<Capability> {
    use Capability::*;
    [Chown, DacOverride, Fsetid, Fowner, Mknod, NetRaw, Setgid, Setuid, Setfcap, Setpcap, NetBindService, SysChroot, Kill, AuditWrite]
        .into_iter()
        .collect()
}

/// For a mount path the host lacks: the nearest directory above it that the host has, with
/// symbolic links resolved (`/var/run/x` -> `/run`); `None` when the path exists or only `/` does.
fn nearest_existing_dir(dest: &Path) -> Option<PathBuf> {
    if fs::symlink_metadata(dest).is_ok() {
        return None;
    }
    let mut at = dest.parent();
    while let Some(dir) = at {
        if let Ok(real) = fs::canonicalize(dir) {
            return (real.is_dir() && real != Path::new("/")).then_some(real);
        }
        at = dir.parent();
    }
    None
}

fn bind(source: &Path, destination: &str, read_only: bool) -> Result<Mount, String> {
    let mut options = vec!["rbind".to_string(), "rprivate".to_string()];
    if read_only {
        options.push("ro".into());
    }
    MountBuilder::default()
        .destination(destination)
        .typ("bind")
        .source(source)
        .options(options)
        .build()
        .map_err(|e| format!("mount {destination}: {e}"))
}

/// The runtime spec of one container. `argv` must not be empty.
pub(crate) fn build(spec: &ContainerSpec, inputs: &SpecInputs<'_>, argv: Vec<String>, user: (u32, u32)) -> Result<Spec, String> {
    let err = |e: oci_spec::OciSpecError| format!("building the runtime spec: {e}");
    let cwd = spec.working_dir.clone().or_else(|| inputs.image.working_dir.clone()).unwrap_or_else(|| "/".into());
    let caps = capabilities(&spec.security)?;
    let capabilities = LinuxCapabilitiesBuilder::default()
        .bounding(caps.clone())
        .effective(caps.clone())
        .permitted(caps)
        // The builder's defaults would put runc's own set here; the ambient set must stay within
        // the permitted one, and containerd passes neither.
        .inheritable(HashSet::new())
        .ambient(HashSet::new())
        .build()
        .map_err(err)?;
    let process = ProcessBuilder::default()
        .terminal(spec.interactive.tty)
        .args(argv)
        .env(terminal_env(env(inputs.image, &spec.env, &spec.hostname), spec.interactive.tty))
        .cwd(cwd)
        .user(UserBuilder::default().uid(user.0).gid(user.1).build().map_err(err)?)
        .capabilities(capabilities)
        .no_new_privileges(spec.security.no_new_privileges)
        .build()
        .map_err(err)?;

    // /sys as a read-only bind: sysfs cannot be mounted anew without the container's own network
    // namespace; the host's cgroup tree comes with it, read-only.
    let mut mounts: Vec<Mount> = Vec::new();
    if inputs.host_root {
        let root = MountBuilder::default()
            .destination("/")
            .typ("bind")
            .source("/")
            .options(vec!["bind".to_string(), "ro".to_string()])
            .build()
            .map_err(|e| format!("mount /: {e}"))?;
        mounts.push(root);
    }
    if inputs.host_root {
        // The host's root is read-only here, so runc cannot make a mount path the host lacks
        // (`/var/run/secrets/...` for a ServiceAccount token): a tmpfs on the nearest directory the
        // host has (never `/` itself) gives it a place to.
        let mut scratch: Vec<PathBuf> = Vec::new();
        for dir in spec.mounts.iter().filter_map(|m| nearest_existing_dir(Path::new(&m.destination))) {
            if !scratch.contains(&dir) {
                scratch.push(dir);
            }
        }
        for dir in scratch {
            let dest = dir.to_string_lossy().into_owned();
            let tmpfs = MountBuilder::default()
                .destination(&dest)
                .typ("tmpfs")
                .source("tmpfs")
                .options(vec!["nosuid".to_string(), "nodev".to_string(), "mode=755".to_string()])
                .build()
                .map_err(|e| format!("mount {dest}: {e}"))?;
            mounts.push(tmpfs);
        }
    }
    mounts.extend(get_default_mounts().into_iter().filter(|m| !m.destination().starts_with("/sys")));
    mounts.push(bind(Path::new("/sys"), "/sys", true)?);
    mounts.push(bind(&inputs.sandbox.hosts, "/etc/hosts", false)?);
    mounts.push(bind(&inputs.sandbox.hostname, "/etc/hostname", false)?);
    mounts.push(bind(&inputs.sandbox.resolv_conf, "/etc/resolv.conf", false)?);
    for m in &spec.mounts {
        mounts.push(bind(&m.source, &m.destination, m.read_only)?);
    }

    let ns = |typ: LinuxNamespaceType, path: Option<&PathBuf>| {
        let b = LinuxNamespaceBuilder::default().typ(typ);
        match path {
            Some(p) => b.path(p.clone()).build(),
            None => b.build(),
        }
    };
    let mut namespaces = vec![
        ns(LinuxNamespaceType::Pid, None).map_err(err)?,
        ns(LinuxNamespaceType::Mount, None).map_err(err)?,
        ns(LinuxNamespaceType::Ipc, Some(&inputs.sandbox.ipc)).map_err(err)?,
        ns(LinuxNamespaceType::Uts, Some(&inputs.sandbox.uts)).map_err(err)?,
    ];
    if let Some(net) = &inputs.sandbox.net {
        namespaces.push(ns(LinuxNamespaceType::Network, Some(net)).map_err(err)?);
    }

    let mut resources = LinuxResourcesBuilder::default();
    if let Some(bytes) = spec.memory_limit_bytes {
        let bytes = i64::try_from(bytes).unwrap_or(i64::MAX);
        resources = resources.memory(LinuxMemoryBuilder::default().limit(bytes).build().map_err(err)?);
    }
    if let Some(quota) = spec.cpu_limit_millis.and_then(cgroup::cpu_quota_us) {
        let quota = i64::try_from(quota).unwrap_or(i64::MAX);
        resources =
            resources.cpu(LinuxCpuBuilder::default().quota(quota).period(cgroup::CPU_PERIOD_US).build().map_err(err)?);
    }
    if let Some(pids) = inputs.pids_limit {
        let pids = i64::try_from(pids).unwrap_or(i64::MAX);
        resources = resources.pids(LinuxPidsBuilder::default().limit(pids).build().map_err(err)?);
    }
    let linux = LinuxBuilder::default()
        .namespaces(namespaces)
        .resources(resources.build().map_err(err)?)
        .cgroups_path(PathBuf::from(&inputs.cgroups_path))
        .masked_paths(if spec.security.privileged { Vec::new() } else { get_default_maskedpaths() })
        .readonly_paths(if spec.security.privileged { Vec::new() } else { get_default_readonly_paths() })
        .build()
        .map_err(err)?;

    let mut out = Spec::default();
    out.set_process(Some(process));
    let readonly = inputs.readonly_root || spec.security.read_only_root;
    out.set_root(Some(RootBuilder::default().path(inputs.rootfs).readonly(readonly).build().map_err(err)?));
    out.set_hostname(Some(spec.hostname.clone()));
    out.set_mounts(Some(mounts));
    out.set_linux(Some(linux));
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runtime::{ContainerId, Mount as BindMount};

    fn s(v: &[&str]) -> Vec<String> {
        v.iter().map(|x| x.to_string()).collect()
    }

    fn image() -> ImageDefaults {
        ImageDefaults {
            entrypoint: s(&["/docker-entrypoint.sh"]),
            cmd: s(&["nginx", "-g", "daemon off;"]),
            env: s(&["PATH=/opt/bin:/bin", "NGINX_VERSION=1.27", "EMPTY"]),
            working_dir: Some("/srv".into()),
            user: None,
        }
    }

    #[test]
    fn command_replaces_the_entrypoint_and_drops_the_image_cmd() {
        assert_eq!(argv(&image(), &s(&["httpd", "-f"]), &[]), s(&["httpd", "-f"]));
        assert_eq!(argv(&image(), &s(&["sh"]), &s(&["-c", "true"])), s(&["sh", "-c", "true"]));
    }

    #[test]
    fn args_alone_replace_the_image_cmd_and_keep_its_entrypoint() {
        assert_eq!(argv(&image(), &[], &s(&["-v"])), s(&["/docker-entrypoint.sh", "-v"]));
    }

    #[test]
    fn neither_command_nor_args_runs_the_entrypoint_with_the_cmd() {
        assert_eq!(argv(&image(), &[], &[]), s(&["/docker-entrypoint.sh", "nginx", "-g", "daemon off;"]));
        assert!(argv(&ImageDefaults::default(), &[], &[]).is_empty());
    }

    #[test]
    fn container_env_overrides_the_image_env_by_name() {
        let container = vec![("NGINX_VERSION".to_string(), "2".to_string()), ("EXTRA".to_string(), "x=y".to_string())];
        let env = env(&image(), &container, "web-0");
        assert_eq!(env, s(&["PATH=/opt/bin:/bin", "HOSTNAME=web-0", "NGINX_VERSION=2", "EMPTY=", "EXTRA=x=y"]));
        let bare = super::env(&ImageDefaults::default(), &[], "h");
        assert_eq!(bare[0], DEFAULT_PATH);
    }

    #[test]
    fn image_users_resolve_by_number_or_by_name_in_the_image_root() {
        let root = tempfile::tempdir().expect("tempdir");
        fs::create_dir_all(root.path().join("etc")).expect("etc");
        fs::write(root.path().join("etc/passwd"), "root:x:0:0::/root:/bin/sh\nwww:x:33:34::/var/www:/bin/false\n").expect("passwd");
        fs::write(root.path().join("etc/group"), "root:x:0:\nstaff:x:50:\n").expect("group");
        assert_eq!(resolve_user(None, root.path()), Ok((0, 0)));
        assert_eq!(resolve_user(Some("www"), root.path()), Ok((33, 34)));
        assert_eq!(resolve_user(Some("33"), root.path()), Ok((33, 34)));
        assert_eq!(resolve_user(Some("1000"), root.path()), Ok((1000, 0)));
        assert_eq!(resolve_user(Some("www:staff"), root.path()), Ok((33, 50)));
        assert_eq!(resolve_user(Some("1000:7"), root.path()), Ok((1000, 7)));
        let missing = resolve_user(Some("nobody"), root.path()).unwrap_err();
        assert!(missing.contains("\"nobody\""), "{missing}");
        assert!(resolve_user(Some("www:nogroup"), root.path()).unwrap_err().contains("nogroup"));
    }

    #[test]
    fn capabilities_start_from_containerds_defaults_then_drop_then_add() {
        let named = |names: &[&str]| names.iter().map(|n| capability(n).expect("known")).collect::<HashSet<_>>();
        let dropped = Security { cap_drop: s(&["ALL"]), cap_add: s(&["NET_ADMIN", "chown"]), ..Default::default() };
        assert_eq!(capabilities(&dropped), Ok(named(&["NET_ADMIN", "CHOWN"])));
        let some = Security { cap_drop: s(&["NET_RAW"]), ..Default::default() };
        let caps = capabilities(&some).expect("caps");
        assert!(!caps.contains(&Capability::NetRaw) && caps.contains(&Capability::Chown));
        assert!(!caps.contains(&Capability::SysAdmin), "not in the default set");
        let privileged = Security { privileged: true, cap_drop: s(&["ALL"]), ..Default::default() };
        assert!(capabilities(&privileged).expect("caps").contains(&Capability::SysAdmin));
        let unknown = Security { cap_add: s(&["FLY"]), ..Default::default() };
        assert!(capabilities(&unknown).unwrap_err().contains("\"FLY\""));
    }

    #[test]
    fn the_spec_joins_the_sandbox_and_carries_limits_and_mounts() {
        let sandbox = SandboxPaths {
            ipc: "/data/sb/ipc".into(),
            uts: "/data/sb/uts".into(),
            net: None,
            hosts: "/data/sb/hosts".into(),
            hostname: "/data/sb/hostname".into(),
            resolv_conf: "/data/sb/resolv.conf".into(),
        };
        let spec = ContainerSpec {
            id: ContainerId { pod_key: "default/web-0".into(), pod_uid: "u1".into(), name: "c".into() },
            image: "busybox:1".into(),
            command: vec![],
            args: vec![],
            env: vec![],
            working_dir: None,
            hostname: "web-0".into(),
            memory_limit_bytes: Some(64 << 20),
            cpu_limit_millis: Some(250),
            simulate_fail: false,
            simulate_exit_after: None,
            restart_count: 0,
            mounts: vec![BindMount { source: "/data/vol".into(), destination: "/vol".into(), read_only: true }],
            security: Security { read_only_root: true, no_new_privileges: true, ..Default::default() },
            interactive: Default::default(),
        };
        let img = image();
        let inputs = SpecInputs {
            rootfs: Path::new("/data/rootfs"),
            host_root: false,
            readonly_root: false,
            image: &img,
            sandbox: &sandbox,
            cgroups_path: "/shepherd-oci/u1_c".into(),
            pids_limit: Some(100),
        };
        let out = build(&spec, &inputs, s(&["sh"]), (0, 0)).expect("spec");
        let json = serde_json::to_value(&out).expect("json");
        assert_eq!(json["hostname"], "web-0");
        assert_eq!(json["root"]["readonly"], true);
        assert_eq!(json["process"]["noNewPrivileges"], true);
        assert_eq!(json["process"]["cwd"], "/srv");
        let ns = json["linux"]["namespaces"].as_array().expect("namespaces");
        assert!(ns.iter().any(|n| n["type"] == "ipc" && n["path"] == "/data/sb/ipc"));
        assert!(ns.iter().any(|n| n["type"] == "uts" && n["path"] == "/data/sb/uts"));
        assert!(!ns.iter().any(|n| n["type"] == "network"), "pods share the host network for now");
        assert_eq!(json["linux"]["resources"]["memory"]["limit"], 64 << 20);
        assert_eq!(json["linux"]["resources"]["cpu"]["quota"], 25_000);
        assert_eq!(json["linux"]["resources"]["pids"]["limit"], 100);
        assert_eq!(json["linux"]["cgroupsPath"], "/shepherd-oci/u1_c");
        let mounts = json["mounts"].as_array().expect("mounts");
        let vol = mounts.iter().find(|m| m["destination"] == "/vol").expect("volume mount");
        assert_eq!(vol["source"], "/data/vol");
        assert!(vol["options"].as_array().is_some_and(|o| o.contains(&serde_json::json!("ro"))));
        assert!(mounts.iter().any(|m| m["destination"] == "/etc/hosts" && m["source"] == "/data/sb/hosts"));

        // A pod network namespace, once the sandbox has one, is joined like the others.
        let netted = SandboxPaths { net: Some("/data/netns/u1".into()), ..sandbox.clone() };
        let out = build(&spec, &SpecInputs { sandbox: &netted, ..inputs }, s(&["sh"]), (0, 0)).expect("spec");
        let json = serde_json::to_value(&out).expect("json");
        let ns = json["linux"]["namespaces"].as_array().expect("namespaces");
        assert!(ns.iter().any(|n| n["type"] == "network" && n["path"] == "/data/netns/u1"), "{ns:?}");
        assert_eq!(json["process"]["terminal"], false);
        let inputs = SpecInputs { cgroups_path: "/shepherd-oci/u1_c".into(), ..inputs };

        // `tty: true` asks runc for a terminal, and the program learns its kind unless told.
        let tty = ContainerSpec { interactive: crate::runtime::Interactive { stdin: true, stdin_once: false, tty: true }, ..spec };
        let json = serde_json::to_value(build(&tty, &inputs, s(&["sh"]), (0, 0)).expect("spec")).expect("json");
        assert_eq!(json["process"]["terminal"], true);
        assert!(json["process"]["env"].as_array().is_some_and(|e| e.contains(&serde_json::json!("TERM=xterm"))), "{json}");
        let told = ContainerSpec { env: vec![("TERM".into(), "vt100".into())], ..tty };
        let json = serde_json::to_value(build(&told, &inputs, s(&["sh"]), (0, 0)).expect("spec")).expect("json");
        let env = json["process"]["env"].as_array().cloned().unwrap_or_default();
        assert_eq!(env.iter().filter(|e| e.as_str().is_some_and(|e| e.starts_with("TERM="))).count(), 1, "{env:?}");
        assert!(env.contains(&serde_json::json!("TERM=vt100")));

        // A CPU limit past the kernel's largest quota (`1P`, which the API accepts) is no quota, not
        // one runc would have the kernel refuse; a small one is held to the kernel's smallest.
        let cpu = |millis| {
            let limited = ContainerSpec { cpu_limit_millis: Some(millis), ..told.clone() };
            let json = serde_json::to_value(build(&limited, &inputs, s(&["sh"]), (0, 0)).expect("spec")).expect("json");
            json["linux"]["resources"]["cpu"]["quota"].clone()
        };
        assert_eq!(cpu(1_000_000_000_000_000), serde_json::Value::Null);
        assert_eq!(cpu(1), 1000);
    }
}
