//! `sheepctl create configmap|secret|serviceaccount|namespace|job|cronjob`: builds the object from
//! kubectl's flags (`--from-literal`, `--from-file`, `--from-env-file`, `--type`, `--cert/--key`,
//! `--docker-*`, `--image`, `--schedule`, `--from=cronjob/NAME`) and creates it, or prints it with
//! `--dry-run=client -o yaml`.

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::{Context, bail};
use base64::Engine;
use clap::{Args, Subcommand, ValueEnum};
use serde_json::{Map, Value, json};
use shepherd_api::kinds::{self, ResourceInfo};

use crate::connection::Cluster;
use crate::{printer, resource};

#[derive(Subcommand)]
pub enum CreateCmd {
    /// A ConfigMap from literals, files (a directory: each regular file in it) and env files.
    #[command(alias = "cm")]
    Configmap {
        name: String,
        #[command(flatten)]
        sources: Sources,
        #[command(flatten)]
        out: OutputFlags,
    },
    /// A Secret.
    #[command(subcommand)]
    Secret(SecretCmd),
    /// A ServiceAccount.
    #[command(alias = "sa")]
    Serviceaccount {
        name: String,
        #[command(flatten)]
        out: OutputFlags,
    },
    /// A Namespace.
    #[command(alias = "ns")]
    Namespace {
        name: String,
        #[command(flatten)]
        out: OutputFlags,
    },
    /// A Job running one container (`--image`, command after `--`), or a Job from a CronJob's
    /// template (`--from=cronjob/NAME`).
    Job {
        name: String,
        #[arg(long, conflicts_with = "from", required_unless_present = "from")]
        image: Option<String>,
        /// `cronjob/NAME`: run the CronJob's Job now.
        #[arg(long)]
        from: Option<String>,
        #[arg(last = true)]
        command: Vec<String>,
        #[command(flatten)]
        out: OutputFlags,
    },
    /// A CronJob running one container on a cron schedule.
    #[command(alias = "cj")]
    Cronjob {
        name: String,
        #[arg(long)]
        image: String,
        /// Cron syntax (`*/5 * * * *`) or a macro (`@hourly`).
        #[arg(long)]
        schedule: String,
        /// The pods' restartPolicy: OnFailure or Never.
        #[arg(long, default_value = "OnFailure")]
        restart: String,
        #[arg(last = true)]
        command: Vec<String>,
        #[command(flatten)]
        out: OutputFlags,
    },
}

#[derive(Subcommand)]
pub enum SecretCmd {
    /// An Opaque (or `--type`) Secret from literals, files and env files.
    Generic {
        name: String,
        #[command(flatten)]
        sources: Sources,
        /// The Secret's type (default Opaque).
        #[arg(long = "type")]
        secret_type: Option<String>,
        #[command(flatten)]
        out: OutputFlags,
    },
    /// A kubernetes.io/tls Secret from a PEM certificate and key.
    Tls {
        name: String,
        #[arg(long, required = true)]
        cert: String,
        #[arg(long, required = true)]
        key: String,
        #[command(flatten)]
        out: OutputFlags,
    },
    /// A kubernetes.io/dockerconfigjson Secret for pulling images from a registry.
    #[command(name = "docker-registry")]
    DockerRegistry {
        name: String,
        #[arg(long, default_value = "https://index.docker.io/v1/")]
        docker_server: String,
        #[arg(long, required = true)]
        docker_username: String,
        #[arg(long, required = true)]
        docker_password: String,
        #[arg(long)]
        docker_email: Option<String>,
        #[command(flatten)]
        out: OutputFlags,
    },
}

/// Where the data of a ConfigMap or generic Secret comes from, as kubectl takes it.
#[derive(Args, Default)]
pub struct Sources {
    /// KEY=VALUE (repeatable).
    #[arg(long = "from-literal")]
    literals: Vec<String>,
    /// [KEY=]PATH: a file (key: its name) or a directory (every regular file in it).
    #[arg(long = "from-file")]
    files: Vec<String>,
    /// A file of KEY=VALUE lines (`#` comments and blank lines skipped).
    #[arg(long = "from-env-file")]
    env_files: Vec<String>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum DryRun {
    None,
    /// Print the object without sending it.
    Client,
    /// Have the server validate and default it, writing nothing.
    Server,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Format {
    Yaml,
    Json,
    Name,
}

#[derive(Args)]
pub struct OutputFlags {
    #[arg(long, value_enum, default_value = "none", num_args = 0..=1, default_missing_value = "client")]
    dry_run: DryRun,
    #[arg(short = 'o', long, value_enum)]
    output: Option<Format>,
}

/// One key and its bytes, in the order the flags gave them.
type Entries = BTreeMap<String, Vec<u8>>;

fn add(entries: &mut Entries, key: String, value: Vec<u8>, from: &str) -> anyhow::Result<()> {
    if entries.contains_key(&key) {
        bail!("cannot add key {key:?} from {from}: another source already has it");
    }
    entries.insert(key, value);
    Ok(())
}

/// Reads every source into keys and bytes, refusing a key given twice as kubectl does.
fn read_sources(s: &Sources) -> anyhow::Result<Entries> {
    let mut entries = Entries::new();
    for lit in &s.literals {
        let (k, v) = lit.split_once('=').with_context(|| format!("--from-literal {lit:?}: expected KEY=VALUE"))?;
        add(&mut entries, k.to_string(), v.as_bytes().to_vec(), "--from-literal")?;
    }
    for spec in &s.files {
        let (key, path) = match spec.split_once('=') {
            Some((k, p)) => (Some(k.to_string()), p),
            None => (None, spec.as_str()),
        };
        let path = Path::new(path);
        if path.is_dir() {
            if key.is_some() {
                bail!("--from-file {spec:?}: a directory cannot be given a key");
            }
            let mut files: Vec<_> = std::fs::read_dir(path)
                .with_context(|| format!("reading {}", path.display()))?
                .filter_map(Result::ok)
                .filter(|e| e.file_type().is_ok_and(|t| t.is_file()))
                .collect();
            files.sort_by_key(|e| e.file_name());
            for e in files {
                let bytes = std::fs::read(e.path()).with_context(|| format!("reading {}", e.path().display()))?;
                add(&mut entries, e.file_name().to_string_lossy().into_owned(), bytes, "--from-file")?;
            }
        } else {
            let bytes = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
            let key = match key {
                Some(k) => k,
                None => path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default(),
            };
            add(&mut entries, key, bytes, "--from-file")?;
        }
    }
    for file in &s.env_files {
        let text = std::fs::read_to_string(file).with_context(|| format!("reading {file}"))?;
        for (n, line) in text.lines().enumerate() {
            let line = line.trim_start();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let (k, v) = line.split_once('=').with_context(|| format!("{file}:{}: expected KEY=VALUE", n + 1))?;
            add(&mut entries, k.to_string(), v.as_bytes().to_vec(), file)?;
        }
    }
    Ok(entries)
}

fn object(kind: &str, name: &str, namespace: Option<&str>) -> Value {
    let mut meta = json!({"name": name});
    if let Some(ns) = namespace {
        meta["namespace"] = json!(ns);
    }
    json!({"apiVersion": "v1", "kind": kind, "metadata": meta})
}

fn b64(bytes: &[u8]) -> Value {
    json!(base64::engine::general_purpose::STANDARD.encode(bytes))
}

/// A ConfigMap: UTF-8 values in `data`, anything else in `binaryData`, as kubectl splits them.
pub fn config_map(name: &str, namespace: &str, entries: &Entries) -> Value {
    let mut cm = object("ConfigMap", name, Some(namespace));
    let (mut data, mut binary) = (Map::new(), Map::new());
    for (k, v) in entries {
        match std::str::from_utf8(v) {
            Ok(text) => data.insert(k.clone(), json!(text)),
            Err(_) => binary.insert(k.clone(), b64(v)),
        };
    }
    if !data.is_empty() {
        cm["data"] = Value::Object(data);
    }
    if !binary.is_empty() {
        cm["binaryData"] = Value::Object(binary);
    }
    cm
}

pub fn secret(name: &str, namespace: &str, secret_type: &str, entries: &Entries) -> Value {
    let mut s = object("Secret", name, Some(namespace));
    s["type"] = json!(secret_type);
    if !entries.is_empty() {
        s["data"] = Value::Object(entries.iter().map(|(k, v)| (k.clone(), b64(v))).collect());
    }
    s
}

/// The `.dockerconfigjson` kubectl writes: one registry, its credentials and their `auth`.
pub fn docker_config(server: &str, user: &str, password: &str, email: Option<&str>) -> Vec<u8> {
    let auth = base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"));
    let mut entry = json!({"username": user, "password": password, "auth": auth});
    if let Some(e) = email {
        entry["email"] = json!(e);
    }
    json!({"auths": {server: entry}}).to_string().into_bytes()
}

/// The pod template of `kubectl create job|cronjob`: one container named after the object.
fn one_container_template(name: &str, image: &str, restart: &str, command: &[String]) -> Value {
    let mut container = json!({"name": name, "image": image});
    if !command.is_empty() {
        container["command"] = json!(command);
    }
    json!({"spec": {"restartPolicy": restart, "containers": [container]}})
}

pub fn job(name: &str, namespace: &str, image: &str, command: &[String]) -> Value {
    let mut job = object("Job", name, Some(namespace));
    job["apiVersion"] = json!("batch/v1");
    job["spec"] = json!({"template": one_container_template(name, image, "Never", command)});
    job
}

pub fn cron_job(name: &str, namespace: &str, image: &str, schedule: &str, restart: &str, command: &[String]) -> Value {
    let mut cj = object("CronJob", name, Some(namespace));
    cj["apiVersion"] = json!("batch/v1");
    cj["spec"] = json!({"schedule": schedule,
        "jobTemplate": {"metadata": {"name": name}, "spec": {"template": one_container_template(name, image, restart, command)}}});
    cj
}

/// A Job from a CronJob's template, owned by the CronJob and marked as started by hand, as
/// `kubectl create job --from=cronjob/NAME` makes it.
pub fn job_from_cron_job(name: &str, cron_job: &Value) -> Value {
    let template = cron_job.pointer("/spec/jobTemplate").cloned().unwrap_or_else(|| json!({}));
    let mut job = object("Job", name, cron_job.pointer("/metadata/namespace").and_then(Value::as_str));
    job["apiVersion"] = json!("batch/v1");
    let mut annotations = template.pointer("/metadata/annotations").and_then(Value::as_object).cloned().unwrap_or_default();
    annotations.insert("cronjob.kubernetes.io/instantiate".into(), json!("manual"));
    job["metadata"]["annotations"] = Value::Object(annotations);
    if let Some(labels) = template.pointer("/metadata/labels").filter(|l| l.is_object()) {
        job["metadata"]["labels"] = labels.clone();
    }
    job["metadata"]["ownerReferences"] = json!([{"apiVersion": "batch/v1", "kind": "CronJob",
        "name": cron_job.pointer("/metadata/name"), "uid": cron_job.pointer("/metadata/uid"), "controller": true}]);
    job["spec"] = template.get("spec").cloned().unwrap_or_else(|| json!({}));
    job
}

pub async fn run(cluster: &Cluster, cmd: CreateCmd) -> anyhow::Result<bool> {
    let ns = cluster.namespace.as_str();
    let (res, obj, out): (&ResourceInfo, Value, OutputFlags) = match cmd {
        CreateCmd::Configmap { name, sources, out } => (&kinds::CONFIGMAP, config_map(&name, ns, &read_sources(&sources)?), out),
        CreateCmd::Serviceaccount { name, out } => (&kinds::SERVICEACCOUNT, object("ServiceAccount", &name, Some(ns)), out),
        CreateCmd::Namespace { name, out } => (&kinds::NAMESPACE, object("Namespace", &name, None), out),
        CreateCmd::Job { name, image: Some(image), from: None, command, out } => (&kinds::JOB, job(&name, ns, &image, &command), out),
        CreateCmd::Job { name, from, out, .. } => {
            let from = from.unwrap_or_default();
            let Some(cron_name) = from.strip_prefix("cronjob/").or_else(|| from.strip_prefix("cronjobs/")) else {
                bail!("--from={from:?}: only cronjob/NAME is supported");
            };
            let cj = cluster.get(&resource::object_path(&kinds::CRONJOB, ns, cron_name)).await?;
            (&kinds::JOB, job_from_cron_job(&name, &cj), out)
        }
        CreateCmd::Cronjob { name, image, schedule, restart, command, out } => {
            (&kinds::CRONJOB, cron_job(&name, ns, &image, &schedule, &restart, &command), out)
        }
        CreateCmd::Secret(SecretCmd::Generic { name, sources, secret_type, out }) => {
            let ty = secret_type.unwrap_or_else(|| "Opaque".into());
            (&kinds::SECRET, secret(&name, ns, &ty, &read_sources(&sources)?), out)
        }
        CreateCmd::Secret(SecretCmd::Tls { name, cert, key, out }) => {
            let mut entries = Entries::new();
            entries.insert("tls.crt".into(), std::fs::read(&cert).with_context(|| format!("reading {cert}"))?);
            entries.insert("tls.key".into(), std::fs::read(&key).with_context(|| format!("reading {key}"))?);
            (&kinds::SECRET, secret(&name, ns, "kubernetes.io/tls", &entries), out)
        }
        CreateCmd::Secret(SecretCmd::DockerRegistry { name, docker_server, docker_username, docker_password, docker_email, out }) => {
            let mut entries = Entries::new();
            let config = docker_config(&docker_server, &docker_username, &docker_password, docker_email.as_deref());
            entries.insert(".dockerconfigjson".into(), config);
            (&kinds::SECRET, secret(&name, ns, "kubernetes.io/dockerconfigjson", &entries), out)
        }
    };
    let shown = match out.dry_run {
        DryRun::Client => obj,
        DryRun::Server | DryRun::None => {
            let mut path = resource::collection_path(res, res.namespaced.then_some(ns));
            if out.dry_run == DryRun::Server {
                path.push_str("?dryRun=All");
            }
            cluster.post(&path, &obj).await?
        }
    };
    let suffix = match out.dry_run {
        DryRun::None => "created",
        DryRun::Client => "created (dry run)",
        DryRun::Server => "created (server dry run)",
    };
    match out.output {
        Some(Format::Yaml) => print!("{}", printer::yaml(&shown)?),
        Some(Format::Json) => println!("{}", printer::json(&shown)),
        Some(Format::Name) => println!("{}", printer::name(res, &shown)),
        None => {
            let name = shown.pointer("/metadata/name").and_then(Value::as_str).unwrap_or_default();
            println!("{} {suffix}", resource::object_ref(res, name));
        }
    }
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sources_become_keys_like_kubectl_makes_them() {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::write(dir.path().join("app.conf"), "x=1\n").expect("write");
        std::fs::write(dir.path().join("logo.bin"), [0xff, 0x00, 0xfe]).expect("write");
        let env = dir.path().join("vars.env");
        std::fs::write(&env, "# comment\n\nMODE=prod\nLEVEL=3\n").expect("write");
        let sources = Sources {
            literals: vec!["a=1".into(), "url=http://x/?q=1".into()],
            files: vec![dir.path().join("app.conf").display().to_string(), format!("logo={}", dir.path().join("logo.bin").display())],
            env_files: vec![env.display().to_string()],
        };
        let cm = config_map("app", "default", &read_sources(&sources).expect("sources"));
        assert_eq!(cm["data"], json!({"a": "1", "url": "http://x/?q=1", "app.conf": "x=1\n", "MODE": "prod", "LEVEL": "3"}));
        assert_eq!(cm["binaryData"], json!({"logo": "/wD+"}), "bytes that are not UTF-8 go to binaryData");

        let twice = Sources { literals: vec!["a=1".into(), "a=2".into()], ..Sources::default() };
        assert!(read_sources(&twice).is_err(), "a key given twice is refused");
        let bad = Sources { literals: vec!["novalue".into()], ..Sources::default() };
        assert!(read_sources(&bad).is_err());
    }

    #[test]
    fn a_job_from_a_cronjob_takes_its_template_and_is_owned_by_it() {
        let cj = cron_job("tick", "default", "busybox", "@hourly", "OnFailure", &["date".to_string()]);
        assert_eq!(cj["spec"]["jobTemplate"]["spec"]["template"]["spec"]["containers"][0]["command"], json!(["date"]));
        let mut stored = cj.clone();
        stored["metadata"]["uid"] = json!("u-1");
        let manual = job_from_cron_job("tick-manual", &stored);
        assert_eq!(manual["metadata"]["ownerReferences"][0]["uid"], "u-1");
        assert_eq!(manual["metadata"]["annotations"]["cronjob.kubernetes.io/instantiate"], "manual");
        assert_eq!(manual["spec"]["template"]["spec"]["restartPolicy"], "OnFailure");
        assert_eq!(job("pi", "default", "busybox", &[])["spec"]["template"]["spec"]["restartPolicy"], "Never");
    }

    #[test]
    fn a_docker_registry_secret_carries_the_auth_kubelet_reads() {
        let config: Value = serde_json::from_slice(&docker_config("r.example:5000", "u", "p", None)).expect("json");
        assert_eq!(config["auths"]["r.example:5000"]["auth"], "dTpw");
        let mut entries = Entries::new();
        entries.insert("k".into(), b"v".to_vec());
        let s = secret("s", "ns", "Opaque", &entries);
        assert_eq!((s["type"].as_str(), s["data"]["k"].as_str()), (Some("Opaque"), Some("dg==")));
    }
}
