//! `imagePullSecrets`: registry credentials from `kubernetes.io/dockerconfigjson` Secrets.

use base64::Engine;
use serde_json::Value;

/// The registry a docker config key names (`https://index.docker.io/v1/`, `host:port`,
/// `https://host:port/path`), as image references name it.
pub(crate) fn registry_of_key(key: &str) -> String {
    let host = key.trim_start_matches("https://").trim_start_matches("http://");
    let host = host.split('/').next().unwrap_or(host);
    match host {
        "index.docker.io" | "registry-1.docker.io" | "docker.io" => "docker.io".to_string(),
        other => other.to_string(),
    }
}

/// (registry, username, password) for every entry of one Secret's `.dockerconfigjson` (or a
/// legacy `.dockercfg`); entries it cannot read are skipped.
pub(crate) fn credentials_of(secret: &Value) -> Vec<(String, String, String)> {
    let b64 = base64::engine::general_purpose::STANDARD;
    let (field, nested) = if secret["data"][".dockerconfigjson"].is_string() {
        (".dockerconfigjson", true)
    } else {
        (".dockercfg", false)
    };
    let Some(config) = secret["data"][field]
        .as_str()
        .and_then(|d| b64.decode(d).ok())
        .and_then(|bytes| serde_json::from_slice::<Value>(&bytes).ok())
    else {
        return Vec::new();
    };
    let auths = if nested { &config["auths"] } else { &config };
    let Some(auths) = auths.as_object() else { return Vec::new() };
    auths
        .iter()
        .filter_map(|(key, entry)| {
            let (user, pass) = match (entry["username"].as_str(), entry["password"].as_str()) {
                (Some(u), Some(p)) => (u.to_string(), p.to_string()),
                _ => {
                    let decoded = b64.decode(entry["auth"].as_str()?).ok()?;
                    let text = String::from_utf8(decoded).ok()?;
                    let (u, p) = text.split_once(':')?;
                    (u.to_string(), p.to_string())
                }
            };
            Some((registry_of_key(key), user, pass))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn secret(field: &str, config: Value) -> Value {
        let b64 = base64::engine::general_purpose::STANDARD;
        json!({"type": "kubernetes.io/dockerconfigjson", "data": {field: b64.encode(config.to_string())}})
    }

    #[test]
    fn docker_config_keys_name_registries_as_references_do() {
        assert_eq!(registry_of_key("https://index.docker.io/v1/"), "docker.io");
        assert_eq!(registry_of_key("registry.example.com:5000"), "registry.example.com:5000");
        assert_eq!(registry_of_key("https://ghcr.io/v2/"), "ghcr.io");
    }

    #[test]
    fn credentials_come_from_username_and_password_or_the_auth_field() {
        let b64 = base64::engine::general_purpose::STANDARD;
        let s = secret(".dockerconfigjson", json!({"auths": {
            "https://index.docker.io/v1/": {"auth": b64.encode("alice:s3cr:et")},
            "127.0.0.1:5000": {"username": "bob", "password": "pw"},
            "broken": {"auth": "%%%"},
        }}));
        let mut creds = credentials_of(&s);
        creds.sort();
        assert_eq!(
            creds,
            vec![
                ("127.0.0.1:5000".to_string(), "bob".to_string(), "pw".to_string()),
                ("docker.io".to_string(), "alice".to_string(), "s3cr:et".to_string()),
            ]
        );
        let legacy = secret(".dockercfg", json!({"quay.io": {"username": "c", "password": "d"}}));
        assert_eq!(credentials_of(&legacy), vec![("quay.io".to_string(), "c".to_string(), "d".to_string())]);
        assert!(credentials_of(&json!({"data": {}})).is_empty());
    }
}
