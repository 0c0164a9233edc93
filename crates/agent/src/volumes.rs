//! Pod volumes on the node, laid out as kubelet lays them out:
//! `<data-dir>/pods/<uid>/volumes/kubernetes.io~<type>/<name>` for emptyDir (a tmpfs for
//! `medium: Memory`), configMap, secret, downwardAPI and projected volumes; hostPath volumes
//! are the host path itself, checked against their `type`.
//!
//! Files of configMap, secret, downwardAPI and projected volumes are written atomically with
//! kubelet's scheme: the files go into a fresh timestamped directory `..<time>`, the `..data`
//! symlink is swapped to it with one rename, and each visible name is a symlink `<key>` ->
//! `..data/<key>`. A reader therefore sees either the old set or the new set of files, never a
//! mix. Every reconcile of a pod re-syncs its volumes, and a changed ConfigMap or Secret
//! triggers that reconcile, so files follow their source within seconds; a `subPath` mount binds
//! the file the symlinks resolve to when the container starts, so it keeps that content (as in
//! Kubernetes). A source that disappears leaves the last content in place.

use std::collections::{BTreeMap, HashMap};
use std::fs;
use std::io;
use std::os::unix::fs::{FileTypeExt, PermissionsExt, symlink};
use std::path::{Component, Path, PathBuf};
use std::sync::Arc;

use serde_json::Value;
use shepherd_api::{JsonPath, str_at};
use tracing::{debug, warn};

use crate::envvars;
use crate::quantity;
use crate::runtime::Mount;
use crate::sources::{SourceKind, Sources};
use crate::tokens::PodTokens;

/// The files of one atomically written volume: relative path to (content, mode).
type Files = BTreeMap<String, (Vec<u8>, u32)>;

const DEFAULT_MODE: u32 = 0o644;

pub(crate) struct Volumes {
    /// `<data-dir>/pods`.
    root: PathBuf,
    sources: Arc<Sources>,
    /// ServiceAccount tokens of projected volumes, requested before each sync.
    tokens: Arc<PodTokens>,
    /// Whether the agent may mount (a tmpfs for `medium: Memory`): it runs as root.
    can_mount: bool,
}

/// Where each of a pod's volumes is on the host, by volume name.
#[derive(Debug, Default)]
pub(crate) struct Prepared {
    paths: HashMap<String, PathBuf>,
    /// Volumes whose content is a snapshot of an API object (read-only in containers).
    read_only: Vec<String>,
}


fn mode_of(v: &Value, key: &str) -> Option<u32> {
    v.get(key).and_then(Value::as_u64).map(|m| m as u32 & 0o777)
}

impl Volumes {
    pub fn new(data_dir: &Path, sources: Arc<Sources>, tokens: Arc<PodTokens>) -> Self {
        // SAFETY: geteuid has no preconditions.
        let can_mount = unsafe { libc::geteuid() } == 0;
        Volumes { root: data_dir.join("pods"), sources, tokens, can_mount }
    }

    /// The ServiceAccount tokens the pods' projected volumes hold.
    pub fn tokens(&self) -> &Arc<PodTokens> {
        &self.tokens
    }

    /// Writes a file the agent gives the pod (its resolv.conf) into the pod's directory, which
    /// `remove` deletes with the pod.
    pub fn pod_file(&self, uid: &str, name: &str, contents: &[u8]) -> io::Result<PathBuf> {
        let dir = self.pod_dir(uid);
        fs::create_dir_all(&dir)?;
        let path = dir.join(name);
        fs::write(&path, contents)?;
        Ok(path)
    }

    fn pod_dir(&self, uid: &str) -> PathBuf {
        let safe: String = uid.chars().map(|c| if c.is_ascii_alphanumeric() || c == '-' { c } else { '_' }).collect();
        self.root.join(if safe.is_empty() { "_".into() } else { safe })
    }

    /// Sets up or refreshes every volume of `pod`. A volume that cannot be set up the first time
    /// (its ConfigMap or Secret is missing, a hostPath fails its type check) is an error naming
    /// it; the pod's containers wait for it.
    pub fn sync(&self, pod: &Value, node: &envvars::Node) -> Result<Prepared, String> {
        let uid = str_at(pod, "/metadata/uid");
        let namespace = str_at(pod, "/metadata/namespace");
        let mut prepared = Prepared::default();
        let volumes = pod.at("/spec/volumes").and_then(Value::as_array).cloned().unwrap_or_default();
        if volumes.is_empty() {
            return Ok(prepared);
        }
        let base = self.pod_dir(uid).join("volumes");
        for vol in &volumes {
            let name = str_at(vol, "/name");
            let dir_for = |plugin: &str| base.join(format!("kubernetes.io~{plugin}")).join(name);
            let fail = |why: String| format!("MountVolume.SetUp failed for volume \"{name}\" : {why}");
            let path = if let Some(e) = vol.get("emptyDir").filter(|v| v.is_object()) {
                let dir = dir_for("empty-dir");
                self.empty_dir(&dir, e).map_err(fail)?;
                dir
            } else if let Some(h) = vol.get("hostPath").filter(|v| v.is_object()) {
                host_path(h).map_err(fail)?
            } else {
                let (plugin, files) = if let Some(cm) = vol.get("configMap").filter(|v| v.is_object()) {
                    ("configmap", self.object_files(SourceKind::ConfigMap, namespace, cm, "name", mode_of(cm, "defaultMode")))
                } else if let Some(sec) = vol.get("secret").filter(|v| v.is_object()) {
                    let mode = mode_of(sec, "defaultMode");
                    ("secret", self.object_files(SourceKind::Secret, namespace, sec, "secretName", mode))
                } else if let Some(d) = vol.get("downwardAPI").filter(|v| v.is_object()) {
                    ("downward-api", Ok(downward_files(pod, d, mode_of(d, "defaultMode"), node)))
                } else if let Some(p) = vol.get("projected").filter(|v| v.is_object()) {
                    ("projected", self.projected_files(pod, p, node))
                } else {
                    return Err(fail("volume type not supported by Shepherd".into()));
                };
                let dir = dir_for(plugin);
                // As kubelet does, a Secret's files live in memory only, never on the node's disk.
                if plugin == "secret" && self.can_mount {
                    fs::create_dir_all(&dir).map_err(|e| fail(format!("creating {}: {e}", dir.display())))?;
                    mount_tmpfs(&dir, None, 0o755).map_err(fail)?;
                }
                match files {
                    Ok(files) => {
                        write_atomically(&dir, &files).map_err(|e| fail(format!("writing {}: {e}", dir.display())))?
                    }
                    // Kubelet keeps the last content when the source goes away.
                    Err(why) if dir.join("..data").exists() => {
                        debug!(volume = name, reason = %why, "keeping the last content")
                    }
                    Err(why) => return Err(fail(why)),
                }
                prepared.read_only.push(name.to_string());
                dir
            };
            prepared.paths.insert(name.to_string(), path);
        }
        Ok(prepared)
    }

    /// Why `pod` must be evicted, as kubelet words it, when an emptyDir on disk (no `medium`) holds
    /// more than its `sizeLimit`. (A `medium: Memory` one is a tmpfs of that size: it cannot.)
    pub fn over_limit(&self, pod: &Value) -> Option<String> {
        let base = self.pod_dir(str_at(pod, "/metadata/uid")).join("volumes/kubernetes.io~empty-dir");
        for vol in pod.at("/spec/volumes").and_then(Value::as_array).into_iter().flatten() {
            let Some(e) = vol.get("emptyDir").filter(|e| str_at(e, "/medium") != "Memory") else { continue };
            let Some(text) = e.get("sizeLimit").and_then(quantity::text) else { continue };
            let Some(limit) = quantity::bytes(&text) else { continue };
            let name = str_at(vol, "/name");
            if disk_usage(&base.join(name)) > limit {
                return Some(format!("Usage of EmptyDir volume \"{name}\" exceeds the limit \"{text}\". "));
            }
        }
        None
    }

    /// Whether `pod` has an emptyDir on disk with a `sizeLimit` (whose usage is to be watched).
    pub fn has_disk_limits(pod: &Value) -> bool {
        pod.at("/spec/volumes").and_then(Value::as_array).into_iter().flatten().any(|v| {
            v.get("emptyDir").is_some_and(|e| str_at(e, "/medium") != "Memory" && e.get("sizeLimit").is_some())
        })
    }

    fn empty_dir(&self, dir: &Path, spec: &Value) -> Result<(), String> {
        fs::create_dir_all(dir).map_err(|e| format!("creating {}: {e}", dir.display()))?;
        if str_at(spec, "/medium") != "Memory" {
            let _ = fs::set_permissions(dir, fs::Permissions::from_mode(0o777));
            return Ok(());
        }
        if !self.can_mount {
            return Err("an emptyDir with medium Memory is a tmpfs, and mounting one needs the agent to run as root"
                .into());
        }
        let size = spec.get("sizeLimit").and_then(quantity::text).and_then(|q| quantity::bytes(&q));
        mount_tmpfs(dir, size, 0o777)
    }

    /// The files of a configMap or secret volume (or projected source): every key, or the
    /// `items` asked for.
    fn object_files(
        &self,
        kind: SourceKind,
        ns: &str,
        spec: &Value,
        name_key: &str,
        default_mode: Option<u32>,
    ) -> Result<Files, String> {
        let name = str_at(spec, &format!("/{name_key}"));
        let optional = spec.get("optional").and_then(Value::as_bool).unwrap_or(false);
        let contents = self.sources.require(kind, ns, name, optional).map_err(|e| e.to_string())?;
        let mode = default_mode.unwrap_or(DEFAULT_MODE);
        let mut files = Files::new();
        match spec.get("items").and_then(Value::as_array).filter(|i| !i.is_empty()) {
            None => {
                for (k, v) in contents {
                    files.insert(k, (v, mode));
                }
            }
            Some(items) => {
                for item in items {
                    let key = str_at(item, "/key");
                    match contents.get(key) {
                        Some(v) => {
                            let item_mode = mode_of(item, "mode").unwrap_or(mode);
                            files.insert(str_at(item, "/path").to_string(), (v.clone(), item_mode));
                        }
                        None if optional => {}
                        None => return Err(format!("{} references non-existent config key: {key}", kind.word())),
                    }
                }
            }
        }
        Ok(files)
    }

    fn projected_files(&self, pod: &Value, spec: &Value, node: &envvars::Node) -> Result<Files, String> {
        let ns = str_at(pod, "/metadata/namespace");
        let mode = mode_of(spec, "defaultMode");
        let mut files = Files::new();
        for s in spec.get("sources").and_then(Value::as_array).into_iter().flatten() {
            let more = if let Some(cm) = s.get("configMap").filter(|v| v.is_object()) {
                self.object_files(SourceKind::ConfigMap, ns, cm, "name", mode)?
            } else if let Some(sec) = s.get("secret").filter(|v| v.is_object()) {
                self.object_files(SourceKind::Secret, ns, sec, "name", mode)?
            } else if let Some(d) = s.get("downwardAPI").filter(|v| v.is_object()) {
                downward_files(pod, d, mode, node)
            } else if let Some(t) = s.get("serviceAccountToken").filter(|v| v.is_object()) {
                let token = self.tokens.token(pod, t)?;
                Files::from([(str_at(t, "/path").to_string(), (token.into_bytes(), mode.unwrap_or(DEFAULT_MODE)))])
            } else {
                continue;
            };
            files.extend(more);
        }
        Ok(files)
    }

    /// The bind mounts of one container: its `volumeMounts`, with `subPath` resolved (and created
    /// in an emptyDir, as kubelet does); volumes of API objects are always read-only.
    pub fn mounts(&self, container: &Value, prepared: &Prepared) -> Result<Vec<Mount>, String> {
        let mut out = Vec::new();
        for vm in container.get("volumeMounts").and_then(Value::as_array).into_iter().flatten() {
            let name = str_at(vm, "/name");
            let Some(base) = prepared.paths.get(name) else {
                return Err(format!("volume \"{name}\" is not ready"));
            };
            let sub = str_at(vm, "/subPath");
            let source = if sub.is_empty() {
                base.clone()
            } else {
                if Path::new(sub).components().any(|c| !matches!(c, Component::Normal(_))) {
                    return Err(format!("subPath {sub:?} of volume \"{name}\" must be a relative path in the volume"));
                }
                let source = base.join(sub);
                if !source.exists() && !prepared.read_only.iter().any(|r| r == name) {
                    fs::create_dir_all(&source).map_err(|e| format!("creating subPath {}: {e}", source.display()))?;
                    let _ = fs::set_permissions(&source, fs::Permissions::from_mode(0o777));
                }
                // Symlinks inside the volume may not lead a mount out of it.
                let real = fs::canonicalize(&source)
                    .map_err(|e| format!("failed to prepare subPath for volumeMount \"{name}\": {sub}: {e}"))?;
                let real_base = fs::canonicalize(base).map_err(|e| format!("volume \"{name}\": {e}"))?;
                if !real.starts_with(&real_base) {
                    return Err(format!("subPath {sub:?} of volume \"{name}\" leads outside the volume"));
                }
                real
            };
            let asked = vm.get("readOnly").and_then(Value::as_bool).unwrap_or(false);
            let read_only = asked || prepared.read_only.iter().any(|r| r == name);
            out.push(Mount { source, destination: str_at(vm, "/mountPath").to_string(), read_only });
        }
        Ok(out)
    }

    /// Removes a pod's volume directories (a tmpfs is unmounted first). Host paths stay.
    pub fn remove(&self, uid: &str) {
        self.tokens.forget(uid);
        let dir = self.pod_dir(uid);
        let plugins = fs::read_dir(dir.join("volumes")).into_iter().flatten().flatten();
        let volumes = plugins.flat_map(|p| fs::read_dir(p.path()).into_iter().flatten().flatten());
        for entry in volumes {
            let path = entry.path();
            if is_mount_point(&path)
                && let Ok(c) = cstring(&path)
            {
                // SAFETY: umount2 with a valid path.
                if unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) } != 0 {
                    warn!(path = %path.display(), error = %io::Error::last_os_error(), "cannot unmount a pod's tmpfs");
                    return;
                }
            }
        }
        if let Err(e) = fs::remove_dir_all(&dir)
            && e.kind() != io::ErrorKind::NotFound
        {
            warn!(dir = %dir.display(), error = %e, "cannot remove a pod's volumes");
        }
    }
}

/// The disk space the files under `dir` take (allocated blocks, as `du` counts), not following
/// symbolic links nor crossing into other filesystems.
fn disk_usage(dir: &Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    let Ok(top) = fs::symlink_metadata(dir) else { return 0 };
    let mut total = 0;
    let mut pending = vec![dir.to_path_buf()];
    while let Some(d) = pending.pop() {
        let Ok(entries) = fs::read_dir(&d) else { continue };
        for entry in entries.flatten() {
            let Ok(m) = entry.metadata() else { continue };
            if m.dev() != top.dev() {
                continue;
            }
            total += m.blocks() * 512;
            if m.is_dir() {
                pending.push(entry.path());
            }
        }
    }
    total
}

fn cstring(p: &Path) -> Result<std::ffi::CString, String> {
    std::ffi::CString::new(p.as_os_str().as_encoded_bytes()).map_err(|_| format!("{} contains a NUL byte", p.display()))
}

/// Whether something is mounted at `p` (it lies on another device than its parent).
fn is_mount_point(p: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    let parent = p.parent().and_then(|d| fs::symlink_metadata(d).ok());
    matches!((fs::symlink_metadata(p), parent), (Ok(m), Some(d)) if m.is_dir() && m.dev() != d.dev())
}

/// Mounts a tmpfs at `dir` (once: a directory already mounted on is left as it is).
fn mount_tmpfs(dir: &Path, size: Option<u64>, mode: u32) -> Result<(), String> {
    if is_mount_point(dir) {
        return Ok(());
    }
    let mut options = format!("mode={mode:o}");
    if let Some(bytes) = size {
        options.push_str(&format!(",size={bytes}"));
    }
    let target = cstring(dir)?;
    let options = std::ffi::CString::new(options).map_err(|_| "bad tmpfs options".to_string())?;
    let flags = libc::MS_NOSUID | libc::MS_NODEV;
    // SAFETY: mount with valid NUL-terminated strings.
    let r = unsafe { libc::mount(c"tmpfs".as_ptr(), target.as_ptr(), c"tmpfs".as_ptr(), flags, options.as_ptr().cast()) };
    if r != 0 {
        return Err(format!("mounting a tmpfs at {}: {}", dir.display(), io::Error::last_os_error()));
    }
    Ok(())
}

/// A hostPath volume's path, after its `type` check (and creation for the `...OrCreate` types).
fn host_path(spec: &Value) -> Result<PathBuf, String> {
    let path = PathBuf::from(str_at(spec, "/path"));
    let ty = str_at(spec, "/type");
    let meta = fs::metadata(&path);
    let is = |check: fn(&fs::Metadata) -> bool, what: &str| match &meta {
        Ok(m) if check(m) => Ok(()),
        Ok(_) => Err(format!("hostPath type check failed: {} is not a {what}", path.display())),
        Err(_) => Err(format!("hostPath type check failed: {} does not exist", path.display())),
    };
    match ty {
        "DirectoryOrCreate" if meta.is_err() => {
            fs::create_dir_all(&path).map_err(|e| format!("creating {}: {e}", path.display()))?;
            let _ = fs::set_permissions(&path, fs::Permissions::from_mode(0o755));
        }
        "FileOrCreate" if meta.is_err() => {
            if let Some(parent) = path.parent() {
                fs::create_dir_all(parent).map_err(|e| format!("creating {}: {e}", parent.display()))?;
            }
            let created = fs::OpenOptions::new().create(true).append(true).open(&path);
            created.map_err(|e| format!("creating {}: {e}", path.display()))?;
            let _ = fs::set_permissions(&path, fs::Permissions::from_mode(0o644));
        }
        "DirectoryOrCreate" | "Directory" => is(|m| m.is_dir(), "directory")?,
        "FileOrCreate" | "File" => is(|m| m.is_file(), "file")?,
        "Socket" => is(|m| m.file_type().is_socket(), "socket")?,
        "CharDevice" => is(|m| m.file_type().is_char_device(), "character device")?,
        "BlockDevice" => is(|m| m.file_type().is_block_device(), "block device")?,
        _ => {}
    }
    Ok(path)
}

/// `key="value"` lines, sorted by key: how the downward API writes labels and annotations.
fn map_lines(map: Option<&Value>) -> String {
    let mut lines: Vec<String> = map
        .and_then(Value::as_object)
        .into_iter()
        .flatten()
        .map(|(k, v)| format!("{k}={}", Value::from(v.as_str().unwrap_or(""))))
        .collect();
    lines.sort();
    lines.join("\n")
}

fn downward_files(pod: &Value, spec: &Value, default_mode: Option<u32>, node: &envvars::Node) -> Files {
    let mode = default_mode.unwrap_or(DEFAULT_MODE);
    let mut files = Files::new();
    for item in spec.get("items").and_then(Value::as_array).into_iter().flatten() {
        let text = if let Some(f) = item.get("fieldRef").filter(|v| v.is_object()) {
            match str_at(f, "/fieldPath") {
                "metadata.labels" => map_lines(pod.at("/metadata/labels")),
                "metadata.annotations" => map_lines(pod.at("/metadata/annotations")),
                path => envvars::field_value(pod, path, node),
            }
        } else if let Some(r) = item.get("resourceFieldRef").filter(|v| v.is_object()) {
            let name = str_at(r, "/containerName");
            let containers = pod.at("/spec/containers").and_then(Value::as_array);
            containers
                .and_then(|cs| cs.iter().find(|c| c["name"] == name))
                .map(|c| envvars::resource_value(c, r, node))
                .unwrap_or_default()
        } else {
            continue;
        };
        files.insert(str_at(item, "/path").to_string(), (text.into_bytes(), mode_of(item, "mode").unwrap_or(mode)));
    }
    files
}

/// Whether the files under `..data` are exactly `files` (content and mode).
fn current_matches(dir: &Path, files: &Files) -> bool {
    let data = dir.join("..data");
    let mut count = 0;
    let mut stack = vec![data.clone()];
    while let Some(d) = stack.pop() {
        let Ok(entries) = fs::read_dir(&d) else { return false };
        for e in entries.flatten() {
            match e.file_type() {
                Ok(t) if t.is_dir() => stack.push(e.path()),
                _ => count += 1,
            }
        }
    }
    count == files.len()
        && files.iter().all(|(path, (bytes, mode))| {
            let p = data.join(path);
            fs::read(&p).is_ok_and(|b| b == *bytes)
                && fs::metadata(&p).is_ok_and(|m| m.permissions().mode() & 0o7777 == *mode)
        })
}

/// Kubelet's atomic writer: see the module docs. Does nothing when the content is unchanged.
fn write_atomically(dir: &Path, files: &Files) -> io::Result<()> {
    if current_matches(dir, files) {
        return Ok(());
    }
    fs::create_dir_all(dir)?;
    fs::set_permissions(dir, fs::Permissions::from_mode(0o755))?;
    let now = jiff::Timestamp::now();
    let stamp = format!("..{}.{:09}", now.strftime("%Y_%m_%d_%H_%M_%S"), now.subsec_nanosecond());
    let fresh = dir.join(&stamp);
    fs::create_dir(&fresh)?;
    fs::set_permissions(&fresh, fs::Permissions::from_mode(0o755))?;
    for (path, (bytes, mode)) in files {
        let target = fresh.join(path);
        if let Some(parent) = target.parent().filter(|p| *p != fresh) {
            fs::create_dir_all(parent)?;
            fs::set_permissions(parent, fs::Permissions::from_mode(0o755))?;
        }
        fs::write(&target, bytes)?;
        fs::set_permissions(&target, fs::Permissions::from_mode(*mode))?;
    }
    let old = fs::read_link(dir.join("..data")).ok();
    let tmp = dir.join("..data_tmp");
    let _ = fs::remove_file(&tmp);
    symlink(&stamp, &tmp)?;
    fs::rename(&tmp, dir.join("..data"))?;
    // The visible names: one symlink per top-level entry, through `..data`.
    let wanted: std::collections::BTreeSet<&str> = files.keys().filter_map(|p| p.split('/').next()).collect();
    for top in &wanted {
        let link = dir.join(top);
        if fs::symlink_metadata(&link).is_err() {
            symlink(Path::new("..data").join(top), &link)?;
        }
    }
    for e in fs::read_dir(dir)?.flatten() {
        let name = e.file_name();
        let name = name.to_string_lossy();
        if !name.starts_with("..") && !wanted.contains(name.as_ref()) {
            let _ = fs::remove_file(e.path());
        }
    }
    if let Some(old) = old.filter(|o| o.as_os_str() != stamp.as_str()) {
        let _ = fs::remove_dir_all(dir.join(old));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    const NODE: envvars::Node = envvars::Node { ip: "10.0.0.7", pod_ip: None, cpu_millis: 2000, memory_bytes: 8 << 30 };

    /// Tokens from a client that issues none (TokenRequest is refused).
    fn no_tokens() -> Arc<PodTokens> {
        Arc::new(PodTokens::new(Arc::new(shepherd_runtime::testing::MemoryClient::new())))
    }

    #[tokio::test]
    async fn a_projected_token_waits_for_its_token_request_and_is_written_with_the_volume_mode() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let volumes = Volumes { root: tmp.path().join("pods"), sources: Arc::new(Sources::fixed(Vec::new())), tokens: no_tokens(), can_mount: false };
        let pod = json!({"metadata": {"uid": "u1", "namespace": "ns", "name": "p"}, "spec": {"serviceAccountName": "bot",
            "containers": [{"name": "c", "volumeMounts": [{"name": "api", "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount"}]}],
            "volumes": [{"name": "api", "projected": {"defaultMode": 0o640, "sources": [
                {"serviceAccountToken": {"path": "token", "expirationSeconds": 3607}},
                {"downwardAPI": {"items": [{"path": "namespace", "fieldRef": {"fieldPath": "metadata.namespace"}}]}}]}}]}});
        let retry = volumes.tokens().refresh(&pod).await;
        assert!(retry.is_some(), "a failed request is retried");
        let err = volumes.sync(&pod, &NODE).expect_err("no token yet");
        assert!(err.contains("volume \"api\"") && err.contains("failed to fetch token"), "{err}");
        volumes.tokens().insert_for_test(&pod, &pod["spec"]["volumes"][0]["projected"]["sources"][0]["serviceAccountToken"], "eyJ.tok.en");
        let prepared = volumes.sync(&pod, &NODE).expect("sync");
        let dir = &volumes.mounts(&pod["spec"]["containers"][0], &prepared).expect("mounts")[0].source;
        assert_eq!(fs::read_to_string(dir.join("token")).ok().as_deref(), Some("eyJ.tok.en"));
        assert_eq!(fs::read_to_string(dir.join("namespace")).ok().as_deref(), Some("ns"));
        assert_eq!(fs::metadata(dir.join("token")).map(|m| m.permissions().mode() & 0o777).ok(), Some(0o640));
        volumes.remove("u1");
        assert!(volumes.tokens().token(&pod, &pod["spec"]["volumes"][0]["projected"]["sources"][0]["serviceAccountToken"]).is_err());
    }

    fn files(entries: &[(&str, &str, u32)]) -> Files {
        entries.iter().map(|(p, c, m)| (p.to_string(), (c.as_bytes().to_vec(), *m))).collect()
    }

    #[test]
    fn the_atomic_writer_swaps_data_and_keeps_symlinks_to_it() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let dir = tmp.path().join("vol");
        write_atomically(&dir, &files(&[("a", "1", 0o644), ("conf/b.yaml", "x: 1", 0o400)])).expect("write");
        assert_eq!(fs::read_to_string(dir.join("a")).ok().as_deref(), Some("1"));
        assert_eq!(fs::read_link(dir.join("a")).ok(), Some(PathBuf::from("..data/a")));
        assert_eq!(fs::metadata(dir.join("conf/b.yaml")).map(|m| m.permissions().mode() & 0o777).ok(), Some(0o400));
        let first = fs::read_link(dir.join("..data")).expect("..data");

        write_atomically(&dir, &files(&[("a", "1", 0o644), ("conf/b.yaml", "x: 1", 0o400)])).expect("rewrite");
        assert_eq!(fs::read_link(dir.join("..data")).ok(), Some(first.clone()), "unchanged content is not rewritten");

        write_atomically(&dir, &files(&[("a", "2", 0o644)])).expect("update");
        assert_eq!(fs::read_to_string(dir.join("a")).ok().as_deref(), Some("2"));
        assert!(fs::symlink_metadata(dir.join("conf")).is_err(), "a removed key disappears");
        assert!(!dir.join(first).exists(), "the old timestamped directory is removed");
    }

    #[test]
    fn config_map_volumes_take_items_modes_and_wait_for_a_missing_map() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let sources = Arc::new(Sources::fixed(vec![(SourceKind::ConfigMap, "ns/app", json!({"data": {"a": "1", "b": "2"}}))]));
        let volumes = Volumes::new(tmp.path(), sources, no_tokens());
        let pod = json!({"metadata": {"uid": "u1", "namespace": "ns", "name": "p", "labels": {"x": "y"}}, "spec": {
            "containers": [{"name": "c", "volumeMounts": [{"name": "cm", "mountPath": "/etc/cm"},
                {"name": "scratch", "mountPath": "/tmp/s", "subPath": "sub"}, {"name": "info", "mountPath": "/info", "readOnly": false}]}],
            "volumes": [{"name": "cm", "configMap": {"name": "app", "items": [{"key": "b", "path": "bee", "mode": 0o600}]}},
                {"name": "scratch", "emptyDir": {}},
                {"name": "info", "downwardAPI": {"items": [{"path": "labels", "fieldRef": {"fieldPath": "metadata.labels"}}]}}]}});
        let prepared = volumes.sync(&pod, &NODE).expect("sync");
        let mounts = volumes.mounts(&pod["spec"]["containers"][0], &prepared).expect("mounts");
        assert_eq!(mounts.len(), 3);
        assert_eq!(fs::read_to_string(mounts[0].source.join("bee")).ok().as_deref(), Some("2"));
        assert!(!mounts[0].source.join("a").exists(), "only the items asked for");
        assert!(mounts[0].read_only && !mounts[1].read_only && mounts[2].read_only, "{mounts:?}");
        assert!(mounts[1].source.ends_with("kubernetes.io~empty-dir/scratch/sub") && mounts[1].source.is_dir());
        assert_eq!(fs::read_to_string(mounts[2].source.join("labels")).ok().as_deref(), Some("x=\"y\""));

        let mut missing = pod.clone();
        missing["metadata"]["uid"] = json!("u2");
        missing["spec"]["volumes"][0]["configMap"]["name"] = json!("later");
        let err = volumes.sync(&missing, &NODE).expect_err("missing");
        assert!(err.contains("volume \"cm\"") && err.contains("configmap \"later\" not found"), "{err}");

        volumes.remove("u1");
        assert!(!tmp.path().join("pods/u1").exists());
    }

    #[test]
    fn a_projected_volume_merges_its_sources_under_one_default_mode() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let sources = Arc::new(Sources::fixed(vec![
            (SourceKind::ConfigMap, "ns/app", json!({"data": {"a": "1"}, "binaryData": {"bin": "AAE="}})),
            (SourceKind::Secret, "ns/db", json!({"data": {"password": "czNjcmV0"}})),
        ]));
        let volumes = Volumes { root: tmp.path().join("pods"), sources, tokens: no_tokens(), can_mount: false };
        let pod = json!({"metadata": {"uid": "u1", "namespace": "ns", "name": "web-0", "annotations": {"b": "2", "a": "1"}},
            "spec": {"containers": [{"name": "c", "resources": {"limits": {"memory": "64Mi"}},
                "volumeMounts": [{"name": "all", "mountPath": "/all"}]}],
            "volumes": [{"name": "all", "projected": {"defaultMode": 0o440, "sources": [
                {"configMap": {"name": "app"}},
                {"secret": {"name": "db", "items": [{"key": "password", "path": "creds/pw", "mode": 0o400}]}},
                {"downwardAPI": {"items": [{"path": "name", "fieldRef": {"fieldPath": "metadata.name"}},
                    {"path": "notes", "fieldRef": {"fieldPath": "metadata.annotations"}},
                    {"path": "mem", "resourceFieldRef": {"containerName": "c", "resource": "limits.memory", "divisor": "1Mi"}}]}},
                {"configMap": {"name": "absent", "optional": true}}]}}]}});
        let prepared = volumes.sync(&pod, &NODE).expect("sync");
        let dir = &volumes.mounts(&pod["spec"]["containers"][0], &prepared).expect("mounts")[0].source;
        let read = |p: &str| fs::read(dir.join(p)).unwrap_or_default();
        let mode = |p: &str| fs::metadata(dir.join(p)).map(|m| m.permissions().mode() & 0o777).unwrap_or(0);
        assert_eq!((read("a"), read("bin"), read("creds/pw")), (b"1".to_vec(), vec![0, 1], b"s3cret".to_vec()));
        assert_eq!((read("name"), read("notes"), read("mem")), (b"web-0".to_vec(), b"a=\"1\"\nb=\"2\"".to_vec(), b"64".to_vec()));
        assert_eq!((mode("a"), mode("creds/pw")), (0o440, 0o400));

        let mut missing = pod.clone();
        missing["spec"]["volumes"][0]["projected"]["sources"][1]["secret"]["name"] = json!("later");
        assert!(volumes.sync(&missing, &NODE).is_ok(), "a source gone after the first sync leaves the last content");
        missing["metadata"]["uid"] = json!("u2");
        let err = volumes.sync(&missing, &NODE).expect_err("a new pod waits for it");
        assert!(err.contains("secret \"later\" not found"), "{err}");
    }

    #[test]
    fn an_empty_dir_on_disk_over_its_size_limit_names_the_volume_and_the_limit() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let volumes = Volumes::new(tmp.path(), Arc::new(Sources::fixed(Vec::new())), no_tokens());
        let pod = json!({"metadata": {"uid": "u1", "namespace": "ns", "name": "p"}, "spec": {"volumes": [
            {"name": "scratch", "emptyDir": {"sizeLimit": "64Ki"}},
            {"name": "free", "emptyDir": {}}]}});
        let node = envvars::Node { ip: "127.0.0.1", pod_ip: None, cpu_millis: 1000, memory_bytes: 1 << 30 };
        let prepared = volumes.sync(&pod, &node).expect("sync");
        assert!(Volumes::has_disk_limits(&pod));
        fs::write(prepared.paths["free"].join("big"), vec![1u8; 256 << 10]).expect("write");
        assert_eq!(volumes.over_limit(&pod), None, "only the limited volume counts");
        fs::create_dir(prepared.paths["scratch"].join("sub")).expect("mkdir");
        fs::write(prepared.paths["scratch"].join("sub/big"), vec![1u8; 256 << 10]).expect("write");
        assert_eq!(
            volumes.over_limit(&pod).as_deref(),
            Some("Usage of EmptyDir volume \"scratch\" exceeds the limit \"64Ki\". ")
        );
    }

    #[test]
    fn host_paths_are_checked_against_their_type() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let file = tmp.path().join("f");
        fs::write(&file, "x").expect("write");
        let check = |path: &Path, ty: &str| host_path(&json!({"path": path, "type": ty}));
        assert!(check(&file, "File").is_ok());
        assert!(check(&file, "Directory").expect_err("not a dir").contains("is not a directory"));
        assert!(check(&tmp.path().join("none"), "Socket").expect_err("missing").contains("does not exist"));
        assert!(check(&tmp.path().join("made/here"), "DirectoryOrCreate").is_ok());
        assert!(tmp.path().join("made/here").is_dir());
        assert!(check(&tmp.path().join("touched"), "FileOrCreate").is_ok());
        assert!(tmp.path().join("touched").is_file());
    }
}
