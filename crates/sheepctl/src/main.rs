//! sheepctl: the command line for Shepherd, shaped like kubectl.

mod apply;
mod connection;
mod cp;
mod create;
mod delete;
mod describe;
mod diff;
mod exec;
mod explain;
mod get;
mod info;
mod logs;
mod manifest;
mod merge_patch;
mod metadata_edit;
mod port_forward;
mod printer;
mod resource;
mod rollout;
mod scale;
mod target;

use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, CommandFactory, Parser, Subcommand};

use connection::{Cluster, ConnectionFlags};

#[derive(Parser)]
#[command(name = "sheepctl", version, about = "Drive a Shepherd cluster from the terminal, the way kubectl drives Kubernetes")]
struct Cli {
    /// API server URL (default: $SHEPHERD_API, else the kubeconfig's current context, else https://127.0.0.1:9876).
    #[arg(long, global = true)]
    server: Option<String>,
    /// The kubeconfig to use (default: $KUBECONFIG, else ~/.kube/config, else
    /// ./shepherd-data/admin.kubeconfig, which `shepherd standalone` writes).
    #[arg(long, global = true, value_name = "FILE")]
    kubeconfig: Option<std::path::PathBuf>,
    /// Bearer token sent with every request.
    #[arg(long, global = true)]
    token: Option<String>,
    /// Namespace to work in (default: the kubeconfig context's, else "default").
    #[arg(short = 'n', long, global = true)]
    namespace: Option<String>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Create or update objects from manifests (JSON or YAML; FILE, DIR or - for stdin).
    Apply {
        #[arg(short = 'f', long = "filename", required = true)]
        files: Vec<String>,
        /// Apply on the server (server-side apply): the server merges the file and records which
        /// fields this manager owns; a field another manager set differently is a conflict.
        #[arg(long)]
        server_side: bool,
        /// With --server-side: take the conflicting fields from their other managers.
        #[arg(long, requires = "server_side")]
        force_conflicts: bool,
        /// The field manager named in managedFields (with --server-side; default `kubectl`, so that
        /// sheepctl and kubectl apply as one manager).
        #[arg(long, requires = "server_side")]
        field_manager: Option<String>,
    },
    /// Create a ConfigMap, Secret, ServiceAccount, Namespace, Job or CronJob from flags, as `kubectl create` does.
    #[command(subcommand)]
    Create(create::CreateCmd),
    /// Show what `apply` would change, as a unified diff of live and would-be objects (exit 1 when they differ).
    Diff {
        #[arg(short = 'f', long = "filename", required = true)]
        files: Vec<String>,
    },
    /// Document a kind or a field: RESOURCE[.field.path], e.g. `pods` or `deploy.spec.replicas`.
    Explain {
        resource: String,
        /// Print every field below, as a tree.
        #[arg(long)]
        recursive: bool,
    },
    /// List objects as tables, or print them as JSON, YAML or names.
    Get(GetCmd),
    /// Show an object's details, conditions and events.
    Describe {
        /// KIND NAME..., or KIND/NAME...
        #[arg(required = true)]
        resource: Vec<String>,
    },
    /// Delete objects by kind and name, or those in manifests.
    Delete {
        /// KIND NAME..., or KIND/NAME...
        resource: Vec<String>,
        #[arg(short = 'f', long = "filename")]
        files: Vec<String>,
        /// What happens to the objects the deleted one owns.
        #[arg(long, value_enum, default_value = "background")]
        cascade: delete::Cascade,
        /// Wait until the objects are gone.
        #[arg(long)]
        wait: bool,
        /// How long --wait waits, in seconds.
        #[arg(long, default_value_t = 60)]
        timeout: u64,
        /// Treat "not found" as success.
        #[arg(long)]
        ignore_not_found: bool,
    },
    /// Set the number of replicas of a deployment or replica set.
    Scale {
        /// deployment/NAME, or deployment NAME.
        #[arg(required = true)]
        resource: Vec<String>,
        #[arg(long)]
        replicas: i32,
    },
    /// Follow or restart the rollout of a deployment.
    #[command(subcommand)]
    Rollout(RolloutCmd),
    /// Print a container's output.
    Logs {
        pod: String,
        /// Container name (defaults to the pod's only container).
        #[arg(short = 'c', long)]
        container: Option<String>,
        /// Keep streaming new output.
        #[arg(short = 'f', long)]
        follow: bool,
        /// Only the last N lines.
        #[arg(long)]
        tail: Option<i64>,
        /// The previous, terminated instance of the container.
        #[arg(short = 'p', long)]
        previous: bool,
        /// Only output newer than this duration (5s, 2m, 3h).
        #[arg(long, value_parser = shepherd_api::duration::parse, conflicts_with = "since_time")]
        since: Option<Duration>,
        /// Only output written at or after this RFC 3339 time.
        #[arg(long)]
        since_time: Option<String>,
        /// Start each line with the time it was written.
        #[arg(long)]
        timestamps: bool,
        /// Stop after this many bytes.
        #[arg(long)]
        limit_bytes: Option<u64>,
    },
    /// Run a command in a container: `exec POD [-c CONTAINER] [-i] [-t] -- COMMAND [ARGS...]`;
    /// sheepctl exits with the command's exit code.
    Exec {
        pod: String,
        /// Container name (defaults to the pod's only container).
        #[arg(short = 'c', long)]
        container: Option<String>,
        /// Pass stdin to the command.
        #[arg(short = 'i', long)]
        stdin: bool,
        /// Give the command a terminal (the local one goes raw; its size follows the window).
        #[arg(short = 't', long)]
        tty: bool,
        #[arg(last = true, required = true)]
        command: Vec<String>,
    },
    /// Attach to a running container: its output from now on (until it ends or Ctrl-C), with `-i`
    /// your input to its stdin (the container needs `stdin: true`), with `-it` its terminal.
    Attach {
        pod: String,
        /// Container name (defaults to the pod's only container).
        #[arg(short = 'c', long)]
        container: Option<String>,
        /// Pass stdin to the container.
        #[arg(short = 'i', long)]
        stdin: bool,
        /// Use the container's terminal (the local one goes raw; its size follows the window).
        #[arg(short = 't', long)]
        tty: bool,
    },
    /// Copy files and directories to and from containers: `cp SRC POD:DEST` or `cp POD:SRC DEST`
    /// (runs `tar` in the container and locally).
    Cp {
        src: String,
        dst: String,
        #[arg(short = 'c', long)]
        container: Option<String>,
    },
    /// Forward local ports to a pod's ports: `port-forward POD [LOCAL:]REMOTE...` (until Ctrl-C).
    PortForward {
        pod: String,
        #[arg(required = true)]
        ports: Vec<String>,
        /// The local address to listen on.
        #[arg(long, default_value = "127.0.0.1")]
        address: String,
    },
    /// List events (as `get events`), optionally watching for new ones.
    Events {
        #[arg(short = 'A', long)]
        all_namespaces: bool,
        #[arg(short = 'w', long)]
        watch: bool,
    },
    /// List the nodes (as `get nodes`).
    Nodes {
        #[arg(short = 'o', long, value_enum)]
        output: Option<get::Output>,
    },
    /// Show the server address, its version and what it holds.
    Info,
    /// Show the client and server versions.
    Version,
    /// Set (KEY=VALUE) or remove (KEY-) annotations.
    Annotate {
        /// KIND NAME KEY=VALUE... KEY-...
        #[arg(required = true)]
        args: Vec<String>,
        #[arg(long)]
        overwrite: bool,
    },
    /// Set (KEY=VALUE) or remove (KEY-) labels.
    Label {
        /// KIND NAME KEY=VALUE... KEY-...
        #[arg(required = true)]
        args: Vec<String>,
        #[arg(long)]
        overwrite: bool,
    },
    /// Print a shell completion script.
    Completion { shell: clap_complete::Shell },
}

#[derive(Args)]
struct GetCmd {
    /// KIND [NAME...], or KIND/NAME...
    #[arg(required = true)]
    resource: Vec<String>,
    #[arg(short = 'o', long, value_enum)]
    output: Option<get::Output>,
    /// Label selector (`app=web`, `tier in (a,b)`, `!canary`).
    #[arg(short = 'l', long)]
    selector: Option<String>,
    /// Field selector (metadata.name, metadata.namespace, spec.nodeName, status.phase).
    #[arg(long)]
    field_selector: Option<String>,
    /// Across all namespaces.
    #[arg(short = 'A', long)]
    all_namespaces: bool,
    /// After listing, print a row for every change.
    #[arg(short = 'w', long)]
    watch: bool,
}

#[derive(Subcommand)]
enum RolloutCmd {
    /// Wait for a deployment's rollout, printing its progress.
    Status {
        #[arg(required = true)]
        resource: Vec<String>,
        /// Give up after this many seconds.
        #[arg(long)]
        timeout: Option<u64>,
    },
    /// Restart a deployment's pods through a rollout.
    Restart {
        #[arg(required = true)]
        resource: Vec<String>,
    },
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    die_quietly_on_a_closed_pipe();
    let cli = Cli::parse();
    // `diff` exits 1 for "differences found", so its errors exit 2, as kubectl's do.
    let error_code = if matches!(cli.command, Command::Diff { .. }) { 2 } else { 1 };
    match run(cli).await {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            let text = format!("{e:#}");
            eprintln!("Error: {}", text.lines().map(str::trim).collect::<Vec<_>>().join(" "));
            ExitCode::from(error_code)
        }
    }
}

/// Ends the process by SIGPIPE (status 141 in a shell), as kubectl and other Unix tools do, when
/// the reader of standard output goes away (`sheepctl get pods | head -1`). Rust ignores SIGPIPE
/// by default, which turns the closed pipe into a panic in `print!`.
fn die_quietly_on_a_closed_pipe() {
    // SAFETY: called first in main, before any thread is started; restoring the default
    // disposition of SIGPIPE has no other effect on the process.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
}

/// Runs one command; `Ok(false)` means a failure was already reported.
async fn run(cli: Cli) -> anyhow::Result<bool> {
    if let Command::Completion { shell } = cli.command {
        clap_complete::generate(shell, &mut Cli::command(), "sheepctl", &mut std::io::stdout());
        return Ok(true);
    }
    let flags = ConnectionFlags { server: cli.server, kubeconfig: cli.kubeconfig, token: cli.token, namespace: cli.namespace };
    let cluster = Cluster::connect(&flags).await?;
    cluster.learn_custom_resources().await;
    match cli.command {
        Command::Apply { files, server_side: false, .. } => apply::run(&cluster, &files).await,
        Command::Apply { files, server_side: true, force_conflicts, field_manager } => {
            let manager = field_manager.unwrap_or_else(|| apply::SERVER_SIDE_MANAGER.to_string());
            apply::run_server_side(&cluster, &files, &manager, force_conflicts).await
        }
        Command::Create(cmd) => create::run(&cluster, cmd).await,
        Command::Diff { files } => diff::run(&cluster, &files).await.map(|differs| !differs),
        Command::Explain { resource, recursive } => explain::run(&cluster, &resource, recursive).await.map(|()| true),
        Command::Get(g) => {
            let args = get::GetArgs {
                resource: g.resource,
                output: g.output,
                selector: g.selector,
                field_selector: g.field_selector,
                all_namespaces: g.all_namespaces,
                watch: g.watch,
            };
            get::run(&cluster, &args).await
        }
        Command::Describe { resource } => describe::run(&cluster, &resource).await,
        Command::Delete { resource, files, cascade, wait, timeout, ignore_not_found } => {
            let args = delete::DeleteArgs { resource, files, cascade, wait, timeout: Duration::from_secs(timeout), ignore_not_found };
            delete::run(&cluster, &args).await
        }
        Command::Scale { resource, replicas } => scale::run(&cluster, &resource, replicas).await.map(|()| true),
        Command::Rollout(RolloutCmd::Status { resource, timeout }) => {
            rollout::status(&cluster, &resource, timeout.map(Duration::from_secs)).await.map(|()| true)
        }
        Command::Rollout(RolloutCmd::Restart { resource }) => rollout::restart(&cluster, &resource).await.map(|()| true),
        Command::Logs { pod, container, follow, tail, previous, since, since_time, timestamps, limit_bytes } => {
            let args = logs::LogsArgs { pod, container, follow, tail, previous, since, since_time, timestamps, limit_bytes };
            logs::run(&cluster, &args).await.map(|()| true)
        }
        Command::Exec { pod, container, stdin, tty, command } => {
            let code = exec::exec(&cluster, &exec::ExecArgs { pod, container, stdin, tty, command }).await?;
            if code != 0 {
                std::process::exit(code);
            }
            Ok(true)
        }
        Command::Attach { pod, container, stdin, tty } => {
            exec::attach(&cluster, &exec::AttachArgs { pod, container, stdin, tty }).await.map(|code| code == 0)
        }
        Command::Cp { src, dst, container } => cp::run(&cluster, &src, &dst, container).await.map(|()| true),
        Command::PortForward { pod, ports, address } => port_forward::run(&cluster, &pod, &ports, &address).await.map(|()| true),
        Command::Events { all_namespaces, watch } => {
            let args = get::GetArgs {
                resource: vec!["events".into()],
                output: None,
                selector: None,
                field_selector: None,
                all_namespaces,
                watch,
            };
            get::run(&cluster, &args).await
        }
        Command::Nodes { output } => {
            let args = get::GetArgs { resource: vec!["nodes".into()], output, selector: None, field_selector: None, all_namespaces: false, watch: false };
            get::run(&cluster, &args).await
        }
        Command::Info => info::info(&cluster).await.map(|()| true),
        Command::Version => info::version(&cluster).await.map(|()| true),
        Command::Annotate { args, overwrite } => {
            metadata_edit::run(&cluster, metadata_edit::Field::Annotations, &args, overwrite).await.map(|()| true)
        }
        Command::Label { args, overwrite } => metadata_edit::run(&cluster, metadata_edit::Field::Labels, &args, overwrite).await.map(|()| true),
        Command::Completion { .. } => Ok(true),
    }
}
