//! What `--help` shows. Every subcommand's flags sit under headings (start here, networking,
//! security, storage, controllers), and `-h`/`--help` shows only the everyday ones, a sentence
//! each, so it fits on a screen; `--help-all` shows every flag with its whole description, the
//! tuning, fault-injection and benchmark knobs under their own last heading.

use clap::{Arg, ArgAction, Command};

/// The headings, in the order they are shown, and the flags under each (long names). A flag named
/// in no list goes under [`REST`].
const SECTIONS: &[(&str, &[&str])] = &[
    ("Start here", &[
        "data-dir", "listen", "runtime", "keep-pods", "in-memory", "node-name", "server", "kubeconfig", "join-token",
        "discovery-token-ca-cert-hash", "output", "user", "group", "ttl", "file",
    ]),
    ("Networking", &[
        "pod-network", "cluster-dns", "cluster-dns-listen", "cluster-domain", "dns-upstream", "service-cluster-ip-range",
        "service-node-port-range", "cluster-cidr", "node-cidr-mask-size", "node-ip", "streaming-address", "registry-listen",
        "registry-data-dir", "registry-test-image", "no-registry", "insecure-registry", "registries", "runc",
    ]),
    ("Security", &[
        "token", "token-auth-file", "insecure-loopback", "tls-cert", "tls-key", "tls-san", "root-ca-file", "client-ca",
        "certificate-authority", "discovery-token-unsafe-skip-ca-verification", "service-account-key-file",
        "service-account-issuer", "api-audiences", "cluster-signing-duration", "node-streaming-token", "streaming-token",
        "audit-log-path", "audit-policy-file", "audit-log-maxsize", "audit-log-maxbackup", "user-write-rate",
        "user-write-burst", "join-timeout",
    ]),
    ("Storage", &[
        "store", "etcd-endpoints", "etcd-prefix", "etcd-compaction-interval", "etcd-cafile", "etcd-certfile", "etcd-keyfile",
        "snapshot-interval", "snapshot-keep", "event-ttl",
    ]),
    ("Controllers", &[
        "controllers", "controller-mode", "resync-seconds", "anti-entropy-seconds", "controller-workers", "controller",
        "node-grace-seconds", "pod-eviction-seconds", "job-backoff-seconds", "hpa-sync-seconds", "agent-mode",
        "leader-elect-lease-duration", "leader-elect-renew-deadline", "leader-elect-retry-period",
    ]),
];

/// The last heading, shown by `--help-all` only.
const REST: &str = "Tuning, fault injection and benchmarks (--help-all)";

/// The flags `-h`/`--help` shows; the others only `--help-all` does.
const EVERYDAY: &[&str] = &[
    "data-dir", "listen", "runtime", "keep-pods", "in-memory", "node-name", "server", "kubeconfig", "join-token",
    "discovery-token-ca-cert-hash", "output", "user", "group", "ttl", "file", "pod-network", "cluster-dns",
    "registry-listen", "insecure-registry", "registries", "token", "token-auth-file", "insecure-loopback", "tls-san", "audit-log-path",
    "store", "etcd-endpoints", "controllers", "controller-mode", "certificate-authority",
];

/// `cmd` and all its subcommands with the layout above and the `--help`/`--help-all` pair.
pub fn arrange(cmd: Command) -> Command {
    let cmd = cmd
        .disable_help_flag(true)
        .mut_args(place)
        .arg(
            Arg::new("help")
                .short('h')
                .long("help")
                .action(ArgAction::HelpShort)
                .help("Print the everyday flags, a sentence each (--help-all prints every flag)")
                .help_heading("Help"),
        )
        .arg(
            Arg::new("help-all")
                .long("help-all")
                .action(ArgAction::HelpLong)
                .help("Print every flag with its whole description")
                .help_heading("Help"),
        );
    let names: Vec<String> = cmd.get_subcommands().map(|s| s.get_name().to_string()).collect();
    names.iter().fold(cmd, |cmd, name| cmd.mut_subcommand(name, arrange))
}

/// One flag's heading, and the sentence `-h` shows of its description.
fn place(arg: Arg) -> Arg {
    let Some(long) = arg.get_long().map(str::to_string) else { return arg };
    let heading = SECTIONS.iter().find(|(_, flags)| flags.contains(&long.as_str())).map_or(REST, |(h, _)| *h);
    let arg = arg.help_heading(heading);
    let arg = if EVERYDAY.contains(&long.as_str()) { arg } else { arg.hide_short_help(true) };
    let Some(full) = arg.get_long_help().or(arg.get_help()).map(ToString::to_string) else { return arg };
    let short = first_sentence(&full);
    if short.len() < full.len() { arg.help(short).long_help(full) } else { arg }
}

/// The description up to its first full stop, semicolon or colon outside brackets (and not the
/// stop of "e.g."): what fits beside the flag.
fn first_sentence(text: &str) -> String {
    let mut depth = 0i32;
    for (i, c) in text.char_indices() {
        match c {
            '(' | '[' => depth += 1,
            ')' | ']' => depth -= 1,
            '.' | ';' | ':' if depth == 0 && text[i + 1..].starts_with(' ') => {
                let before = &text[..i];
                if !(before.ends_with("e.g") || before.ends_with("i.e")) {
                    return before.to_string();
                }
            }
            _ => {}
        }
    }
    text.trim_end_matches('.').to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_flag_shows_its_first_sentence_and_keeps_the_rest_for_help_all() {
        assert_eq!(first_sentence("Directory for the store and other state; created if absent"), "Directory for the store and other state");
        assert_eq!(first_sentence("Serve plain HTTP. Only on loopback"), "Serve plain HTTP");
        assert_eq!(first_sentence("Keep an in-memory store only (nothing written to disk)"), "Keep an in-memory store only (nothing written to disk)");
        assert_eq!(first_sentence("The runtime (default: oci when root). More"), "The runtime (default: oci when root)");
        assert_eq!(first_sentence("Also serve a registry (e.g. 127.0.0.1:5000): more"), "Also serve a registry (e.g. 127.0.0.1:5000)");
        assert_eq!(first_sentence("Pods' network, e.g. bridge. More"), "Pods' network, e.g. bridge");
    }

    #[test]
    fn every_listed_flag_is_listed_once() {
        let mut seen = std::collections::HashSet::new();
        for (_, flags) in SECTIONS {
            for f in *flags {
                assert!(seen.insert(*f), "{f} is under two headings");
            }
        }
        for f in EVERYDAY {
            assert!(seen.contains(f), "{f} is an everyday flag under no heading");
        }
    }
}
