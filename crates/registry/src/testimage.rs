//! Builds small OCI images from the host's static busybox, for tests that must not reach the internet.
//!
//! The same builder settings give the same bytes and digests every time: tar entries are sorted,
//! owned by root, dated 0, and the gzip header carries no time or name.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};

use oci_spec::image::{
    ConfigBuilder, Descriptor, ImageConfigurationBuilder, ImageIndex, ImageIndexBuilder, ImageManifestBuilder,
    MediaType, RootFsBuilder, SCHEMA_VERSION,
};

use crate::name::Digest;

/// Where Debian's `busybox-static` installs its binary.
pub const BUSYBOX: &str = "/bin/busybox";
/// A file only the test image has, to tell its root filesystem from the host's.
pub const MARKER_PATH: &str = "/etc/shepherd-test-image";

/// Applets linked to `/bin/busybox`: what tests and benchmarks run in the image.
const APPLETS: &[&str] = &[
    "[",
    "awk",
    "basename",
    "cat",
    "chmod",
    "cp",
    "cut",
    "date",
    "dd",
    "df",
    "dirname",
    "du",
    "echo",
    "env",
    "expr",
    "false",
    "find",
    "free",
    "grep",
    "gunzip",
    "gzip",
    "head",
    "hostname",
    "httpd",
    "id",
    "ifconfig",
    "ip",
    "kill",
    "ln",
    "ls",
    "md5sum",
    "mkdir",
    "mount",
    "mv",
    "nc",
    "netstat",
    "nproc",
    "nslookup",
    "pidof",
    "ping",
    "printf",
    "ps",
    "pwd",
    "readlink",
    "rm",
    "sed",
    "seq",
    "sh",
    "sha256sum",
    "sleep",
    "sort",
    "stat",
    "sync",
    "tail",
    // kubectl cp runs `tar cf -` and `tar xmf -` in the container.
    "tar",
    "tee",
    "test",
    "timeout",
    "top",
    "touch",
    "tr",
    "true",
    "uname",
    "uptime",
    "vi",
    "wc",
    "wget",
    "which",
    "whoami",
    "xargs",
    "yes",
];

#[derive(Debug, thiserror::Error)]
pub enum TestImageError {
    #[error("reading {path}: {source} (Debian's busybox-static package installs it)")]
    Busybox { path: PathBuf, source: std::io::Error },
    #[error("building the image: {0}")]
    Build(String),
    #[error("writing {path}: {source}")]
    Write { path: PathBuf, source: std::io::Error },
    #[error("pushing to {url}: {message}")]
    Push { url: String, message: String },
}

#[derive(Clone)]
enum Entry {
    Directory {
        mode: u32,
    },
    File {
        data: Vec<u8>,
        mode: u32,
    },
    Symlink {
        target: String,
    },
    /// Written with its name as given, unchecked: for images a puller must refuse.
    Hostile {
        kind: HostileKind,
        data: Vec<u8>,
    },
}

#[derive(Clone, Copy)]
enum HostileKind {
    File,
    CharDevice,
    HardLink,
}

/// A one-layer image under construction.
#[derive(Clone)]
pub struct ImageBuilder {
    /// Paths without the leading `/`; sorted, so parents come before their children in the tar.
    entries: BTreeMap<String, Entry>,
    entrypoint: Option<Vec<String>>,
    cmd: Option<Vec<String>>,
    env: Vec<String>,
    working_dir: Option<String>,
}

impl Default for ImageBuilder {
    fn default() -> Self {
        Self::new()
    }
}

impl ImageBuilder {
    /// An image with an empty root filesystem and no command.
    pub fn new() -> Self {
        Self { entries: BTreeMap::new(), entrypoint: None, cmd: None, env: Vec::new(), working_dir: None }
    }

    /// The busybox image: `/bin/busybox` from the host with applet links (`sh`, `httpd`, `wget`, `nc`,
    /// `sleep`, `cat`, `ls`, `hostname`, ...), `/etc/passwd` and `/etc/group` (root, nobody), a world
    /// writable `/tmp`, a page for `httpd` in `/www/index.html`, the marker file [`MARKER_PATH`],
    /// `PATH` set, working directory `/` and `sh` as its command.
    pub fn busybox() -> Result<Self, TestImageError> {
        Self::busybox_from(Path::new(BUSYBOX))
    }

    /// As [`ImageBuilder::busybox`] with the binary read from `path`.
    pub fn busybox_from(path: &Path) -> Result<Self, TestImageError> {
        let binary =
            std::fs::read(path).map_err(|source| TestImageError::Busybox { path: path.to_path_buf(), source })?;
        let mut image = Self::new()
            .directory("/bin", 0o755)
            .directory("/etc", 0o755)
            .directory("/proc", 0o555)
            .directory("/sys", 0o555)
            .directory("/dev", 0o755)
            .directory("/root", 0o700)
            .directory("/tmp", 0o1777)
            .directory("/var", 0o755)
            .file("/bin/busybox", binary, 0o755)
            .file("/etc/passwd", "root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/:/bin/false\n", 0o644)
            .file("/etc/group", "root:x:0:\nnogroup:x:65534:\n", 0o644)
            .file(MARKER_PATH, "shepherd busybox test image\n", 0o644)
            .file("/www/index.html", "hello from the shepherd test image\n", 0o644)
            .env("PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin")
            .working_dir("/")
            .cmd(["sh"]);
        for applet in APPLETS {
            image = image.symlink(&format!("/bin/{applet}"), "busybox");
        }
        Ok(image)
    }

    /// Adds (or replaces) a regular file; missing parent directories are added with mode 0755.
    pub fn file(mut self, path: &str, data: impl Into<Vec<u8>>, mode: u32) -> Self {
        let path = self.add_parents(path);
        self.entries.insert(path, Entry::File { data: data.into(), mode });
        self
    }

    pub fn directory(mut self, path: &str, mode: u32) -> Self {
        let path = self.add_parents(path);
        self.entries.insert(path, Entry::Directory { mode });
        self
    }

    pub fn symlink(mut self, path: &str, target: &str) -> Self {
        let path = self.add_parents(path);
        self.entries.insert(path, Entry::Symlink { target: target.to_string() });
        self
    }

    /// Adds a regular file whose tar name is written exactly as given, e.g. `../../etc/escaped`:
    /// for testing that an unpacker refuses paths leaving the root. No parents are added.
    pub fn hostile_file(mut self, name: &str, data: impl Into<Vec<u8>>) -> Self {
        self.entries.insert(name.to_string(), Entry::Hostile { kind: HostileKind::File, data: data.into() });
        self
    }

    /// Adds a character device node (1:3, as `/dev/null`), which an unpacker should refuse.
    pub fn char_device(mut self, name: &str) -> Self {
        self.entries.insert(name.to_string(), Entry::Hostile { kind: HostileKind::CharDevice, data: Vec::new() });
        self
    }

    /// Adds a hard link to `target`, written as given (e.g. `../../etc/passwd`).
    pub fn hard_link(mut self, name: &str, target: &str) -> Self {
        self.entries
            .insert(name.to_string(), Entry::Hostile { kind: HostileKind::HardLink, data: target.as_bytes().to_vec() });
        self
    }

    pub fn entrypoint<S: Into<String>>(mut self, entrypoint: impl IntoIterator<Item = S>) -> Self {
        self.entrypoint = Some(entrypoint.into_iter().map(Into::into).collect());
        self
    }

    pub fn cmd<S: Into<String>>(mut self, cmd: impl IntoIterator<Item = S>) -> Self {
        self.cmd = Some(cmd.into_iter().map(Into::into).collect());
        self
    }

    /// Adds `NAME=value` to the image's environment, replacing an earlier value of `NAME`.
    pub fn env(mut self, variable: &str) -> Self {
        let name = variable.split('=').next().unwrap_or(variable);
        self.env.retain(|existing| existing.split('=').next() != Some(name));
        self.env.push(variable.to_string());
        self
    }

    pub fn working_dir(mut self, dir: &str) -> Self {
        self.working_dir = Some(dir.to_string());
        self
    }

    /// Normalises `path` to its tar form and makes sure every parent directory has an entry.
    fn add_parents(&mut self, path: &str) -> String {
        let path = path.trim_matches('/').to_string();
        let mut parent = String::new();
        let components: Vec<&str> = path.split('/').collect();
        for component in &components[..components.len().saturating_sub(1)] {
            if !parent.is_empty() {
                parent.push('/');
            }
            parent.push_str(component);
            self.entries.entry(parent.clone()).or_insert(Entry::Directory { mode: 0o755 });
        }
        path
    }

    /// The image's blobs and manifest.
    pub fn build(&self) -> Result<Image, TestImageError> {
        let tar = self.layer_tar().map_err(|e| TestImageError::Build(format!("layer tar: {e}")))?;
        let diff_id = Digest::of(&tar);
        let mut gzip = flate2::GzBuilder::new().mtime(0).write(Vec::new(), flate2::Compression::default());
        gzip.write_all(&tar).map_err(|e| TestImageError::Build(format!("gzip: {e}")))?;
        let layer = gzip.finish().map_err(|e| TestImageError::Build(format!("gzip: {e}")))?;
        let layer_digest = Digest::of(&layer);

        let build_error = |e: oci_spec::OciSpecError| TestImageError::Build(e.to_string());
        let mut config = ConfigBuilder::default().env(self.env.clone());
        if let Some(entrypoint) = &self.entrypoint {
            config = config.entrypoint(entrypoint.clone());
        }
        if let Some(cmd) = &self.cmd {
            config = config.cmd(cmd.clone());
        }
        if let Some(dir) = &self.working_dir {
            config = config.working_dir(dir.clone());
        }
        let configuration = ImageConfigurationBuilder::default()
            .architecture(oci_spec::image::Arch::default())
            .os(oci_spec::image::Os::Linux)
            .config(config.build().map_err(build_error)?)
            .rootfs(
                RootFsBuilder::default()
                    .typ("layers")
                    .diff_ids(vec![diff_id.to_string()])
                    .build()
                    .map_err(build_error)?,
            )
            .build()
            .map_err(build_error)?;
        let config = serde_json::to_vec(&configuration).map_err(|e| TestImageError::Build(e.to_string()))?;
        let config_digest = Digest::of(&config);

        let manifest = ImageManifestBuilder::default()
            .schema_version(SCHEMA_VERSION)
            .media_type(MediaType::ImageManifest)
            .config(descriptor(MediaType::ImageConfig, &config, &config_digest)?)
            .layers(vec![descriptor(MediaType::ImageLayerGzip, &layer, &layer_digest)?])
            .build()
            .map_err(build_error)?;
        let manifest = serde_json::to_vec(&manifest).map_err(|e| TestImageError::Build(e.to_string()))?;
        let manifest_digest = Digest::of(&manifest);
        Ok(Image { manifest, manifest_digest, config, config_digest, layer, layer_digest, diff_id })
    }

    fn layer_tar(&self) -> std::io::Result<Vec<u8>> {
        let mut tar = tar::Builder::new(Vec::new());
        for (path, entry) in &self.entries {
            let mut header = tar::Header::new_ustar();
            header.set_uid(0);
            header.set_gid(0);
            header.set_mtime(0);
            match entry {
                Entry::Directory { mode } => {
                    header.set_entry_type(tar::EntryType::Directory);
                    header.set_mode(*mode);
                    header.set_size(0);
                    tar.append_data(&mut header, format!("{path}/"), std::io::empty())?;
                }
                Entry::File { data, mode } => {
                    header.set_entry_type(tar::EntryType::Regular);
                    header.set_mode(*mode);
                    header.set_size(data.len() as u64);
                    tar.append_data(&mut header, path, data.as_slice())?;
                }
                Entry::Symlink { target } => {
                    header.set_entry_type(tar::EntryType::Symlink);
                    header.set_mode(0o777);
                    header.set_size(0);
                    tar.append_link(&mut header, path, target)?;
                }
                Entry::Hostile { kind, data } => {
                    // The tar crate refuses such names, rightly; they are written into the header by hand.
                    let old = header.as_old_mut();
                    copy_raw(&mut old.name, path)?;
                    let body: &[u8] = match kind {
                        HostileKind::File => {
                            header.set_entry_type(tar::EntryType::Regular);
                            header.set_size(data.len() as u64);
                            data
                        }
                        HostileKind::CharDevice => {
                            header.set_entry_type(tar::EntryType::Char);
                            header.set_device_major(1)?;
                            header.set_device_minor(3)?;
                            header.set_size(0);
                            &[]
                        }
                        HostileKind::HardLink => {
                            copy_raw(&mut header.as_old_mut().linkname, &String::from_utf8_lossy(data))?;
                            header.set_entry_type(tar::EntryType::Link);
                            header.set_size(0);
                            &[]
                        }
                    };
                    header.set_mode(0o644);
                    header.set_cksum();
                    tar.append(&header, body)?;
                }
            }
        }
        tar.into_inner()
    }
}

/// Copies `value` into a fixed-size, NUL-padded tar header field.
fn copy_raw(field: &mut [u8], value: &str) -> std::io::Result<()> {
    let bytes = value.as_bytes();
    if bytes.len() > field.len() {
        return Err(std::io::Error::other(format!("{value:?} is longer than a tar name field")));
    }
    field.fill(0);
    field[..bytes.len()].copy_from_slice(bytes);
    Ok(())
}

fn descriptor(media_type: MediaType, data: &[u8], digest: &Digest) -> Result<Descriptor, TestImageError> {
    let digest: oci_spec::image::Digest =
        digest.as_str().parse().map_err(|e: oci_spec::OciSpecError| TestImageError::Build(e.to_string()))?;
    Ok(Descriptor::new(media_type, data.len() as u64, digest))
}

/// A built image: an OCI manifest, its config and one gzip layer.
#[derive(Clone)]
pub struct Image {
    pub manifest: Vec<u8>,
    pub manifest_digest: Digest,
    pub config: Vec<u8>,
    pub config_digest: Digest,
    pub layer: Vec<u8>,
    pub layer_digest: Digest,
    /// The digest of the uncompressed layer, as the config's `rootfs.diff_ids` lists it.
    pub diff_id: Digest,
}

impl Image {
    /// The blobs a manifest push needs first: config, then layer.
    pub fn blobs(&self) -> [(&Digest, &[u8]); 2] {
        [(&self.config_digest, &self.config), (&self.layer_digest, &self.layer)]
    }

    /// Writes the image into an OCI image layout directory under `tag`, as `skopeo copy oci:DIR:TAG`
    /// reads it; other images already in the layout are kept, one with the same tag is replaced.
    pub fn write_oci_layout(&self, dir: &Path, tag: &str) -> Result<(), TestImageError> {
        let write = |path: PathBuf, data: &[u8]| {
            std::fs::write(&path, data).map_err(|source| TestImageError::Write { path, source })
        };
        let blobs = dir.join("blobs/sha256");
        std::fs::create_dir_all(&blobs).map_err(|source| TestImageError::Write { path: blobs.clone(), source })?;
        write(dir.join("oci-layout"), br#"{"imageLayoutVersion":"1.0.0"}"#)?;
        for (digest, data) in self.blobs().into_iter().chain([(&self.manifest_digest, self.manifest.as_slice())]) {
            write(blobs.join(digest.hex()), data)?;
        }
        const REF_NAME: &str = "org.opencontainers.image.ref.name";
        let mut manifests: Vec<Descriptor> = match std::fs::read(dir.join("index.json")) {
            Ok(bytes) => {
                serde_json::from_slice::<ImageIndex>(&bytes).map(|index| index.manifests().clone()).unwrap_or_default()
            }
            Err(_) => Vec::new(),
        };
        manifests.retain(|m| m.annotations().as_ref().and_then(|a| a.get(REF_NAME)).map(String::as_str) != Some(tag));
        let mut entry = descriptor(MediaType::ImageManifest, &self.manifest, &self.manifest_digest)?;
        entry.set_annotations(Some([(REF_NAME.to_string(), tag.to_string())].into_iter().collect()));
        manifests.push(entry);
        let index = ImageIndexBuilder::default()
            .schema_version(SCHEMA_VERSION)
            .media_type(MediaType::ImageIndex)
            .manifests(manifests)
            .build()
            .map_err(|e| TestImageError::Build(e.to_string()))?;
        let index = serde_json::to_vec(&index).map_err(|e| TestImageError::Build(e.to_string()))?;
        write(dir.join("index.json"), &index)
    }

    /// Pushes the image to a registry as `repository:tag`; `registry` is a base URL such as
    /// `http://127.0.0.1:5000`. Blobs the repository already has are not sent again.
    pub async fn push(&self, registry: &str, repository: &str, tag: &str) -> Result<(), TestImageError> {
        let base = registry.trim_end_matches('/');
        let client = reqwest::Client::new();
        let failed = |url: &str, message: String| TestImageError::Push { url: url.to_string(), message };
        for (digest, data) in self.blobs() {
            let url = format!("{base}/v2/{repository}/blobs/{digest}");
            let present = client.head(&url).send().await.map_err(|e| failed(&url, e.to_string()))?;
            if present.status().is_success() {
                continue;
            }
            let url = format!("{base}/v2/{repository}/blobs/uploads/?digest={digest}");
            let response = client
                .post(&url)
                .header(reqwest::header::CONTENT_TYPE, "application/octet-stream")
                .body(data.to_vec())
                .send()
                .await
                .map_err(|e| failed(&url, e.to_string()))?;
            expect_created(&url, response).await?;
        }
        let url = format!("{base}/v2/{repository}/manifests/{tag}");
        let response = client
            .put(&url)
            .header(reqwest::header::CONTENT_TYPE, crate::OCI_MANIFEST)
            .body(self.manifest.clone())
            .send()
            .await
            .map_err(|e| failed(&url, e.to_string()))?;
        expect_created(&url, response).await
    }
}

async fn expect_created(url: &str, response: reqwest::Response) -> Result<(), TestImageError> {
    if response.status() == reqwest::StatusCode::CREATED {
        return Ok(());
    }
    let status = response.status();
    let body = response.text().await.unwrap_or_default();
    Err(TestImageError::Push { url: url.to_string(), message: format!("{status}: {body}") })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_same_settings_give_the_same_digests() {
        let first = ImageBuilder::new().file("/etc/a", "a", 0o644).cmd(["x"]).build().expect("build");
        let second = ImageBuilder::new().file("/etc/a", "a", 0o644).cmd(["x"]).build().expect("build");
        assert_eq!(first.manifest_digest, second.manifest_digest);
        assert_eq!(first.layer, second.layer);
        let other = ImageBuilder::new().file("/etc/a", "b", 0o644).cmd(["x"]).build().expect("build");
        assert_ne!(first.layer_digest, other.layer_digest);
    }

    #[test]
    fn the_busybox_layer_has_the_binary_its_applets_and_the_marker() {
        let image = ImageBuilder::busybox().expect("busybox-static installed").build().expect("build");
        let tar = flate2::read::GzDecoder::new(image.layer.as_slice());
        let mut archive = tar::Archive::new(tar);
        let mut seen = BTreeMap::new();
        for entry in archive.entries().expect("entries") {
            let entry = entry.expect("entry");
            let path = entry.path().expect("path").to_string_lossy().into_owned();
            let link = entry.link_name().expect("link").map(|l| l.to_string_lossy().into_owned());
            seen.insert(path, (entry.header().entry_type(), link, entry.header().size().unwrap_or(0)));
        }
        assert_eq!(seen["bin/sh"].1.as_deref(), Some("busybox"));
        assert_eq!(seen["bin/httpd"].1.as_deref(), Some("busybox"));
        assert_eq!(seen["bin/tar"].1.as_deref(), Some("busybox"), "kubectl cp needs tar in the container");
        assert!(seen["bin/busybox"].2 > 100_000, "the static binary is in the layer");
        assert!(seen.contains_key("etc/shepherd-test-image"));
        assert!(seen["tmp/"].0.is_dir());

        let config: serde_json::Value = serde_json::from_slice(&image.config).expect("config");
        assert_eq!(config["config"]["Cmd"], serde_json::json!(["sh"]));
        assert_eq!(config["rootfs"]["diff_ids"][0], image.diff_id.as_str());
    }

    #[test]
    fn the_unpacked_busybox_layer_runs_its_applets() {
        let image = ImageBuilder::busybox().expect("busybox-static installed").build().expect("build");
        let root = tempfile::tempdir().expect("tempdir");
        tar::Archive::new(flate2::read::GzDecoder::new(image.layer.as_slice())).unpack(root.path()).expect("unpack");
        // busybox picks the applet from the name it is started as, so the links work outside a chroot.
        let output = std::process::Command::new(root.path().join("bin/sh"))
            .arg("-c")
            .arg(format!("cat {}{MARKER_PATH} && echo $((6 * 7))", root.path().display()))
            .output()
            .expect("run the image's sh");
        assert!(output.status.success(), "{output:?}");
        assert_eq!(String::from_utf8_lossy(&output.stdout), "shepherd busybox test image\n42\n");
        let help = std::process::Command::new(root.path().join("bin/httpd")).arg("--help").output().expect("httpd");
        assert!(String::from_utf8_lossy(&help.stderr).contains("httpd"), "{help:?}");
    }

    #[test]
    fn hostile_entries_reach_the_layer_as_written() {
        let image = ImageBuilder::new()
            .hostile_file("../../escaped", "x")
            .char_device("dev/evil")
            .hard_link("etc/link", "../../etc/passwd")
            .build()
            .expect("build");
        let mut archive = tar::Archive::new(flate2::read::GzDecoder::new(image.layer.as_slice()));
        let mut seen = Vec::new();
        for entry in archive.entries().expect("entries") {
            let entry = entry.expect("entry");
            let name = String::from_utf8_lossy(&entry.path_bytes()).into_owned();
            let link = entry.link_name_bytes().map(|l| String::from_utf8_lossy(&l).into_owned());
            seen.push((name, entry.header().entry_type(), link));
        }
        assert!(seen.contains(&("../../escaped".to_string(), tar::EntryType::Regular, None)), "{seen:?}");
        assert!(seen.iter().any(|(n, t, _)| n == "dev/evil" && t.is_character_special()), "{seen:?}");
        assert!(seen.contains(&("etc/link".to_string(), tar::EntryType::Link, Some("../../etc/passwd".to_string()))));
    }

    #[test]
    fn an_oci_layout_keeps_other_tags_and_replaces_the_same_tag() {
        let dir = tempfile::tempdir().expect("tempdir");
        let one = ImageBuilder::new().file("/a", "1", 0o644).build().expect("build");
        let two = ImageBuilder::new().file("/a", "2", 0o644).build().expect("build");
        one.write_oci_layout(dir.path(), "one").expect("write");
        two.write_oci_layout(dir.path(), "two").expect("write");
        two.write_oci_layout(dir.path(), "one").expect("write");
        let index: serde_json::Value =
            serde_json::from_slice(&std::fs::read(dir.path().join("index.json")).expect("index")).expect("json");
        let manifests = index["manifests"].as_array().expect("manifests");
        assert_eq!(manifests.len(), 2);
        assert!(manifests.iter().all(|m| m["digest"] == two.manifest_digest.as_str()));
        assert!(dir.path().join("blobs/sha256").join(two.layer_digest.hex()).is_file());
    }
}
