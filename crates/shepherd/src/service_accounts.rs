//! The ServiceAccount token settings of `server` and `standalone`: the signing key (generated into
//! `<data-dir>/pki/sa.key` on first start, or `--service-account-key-file`, ECDSA or RSA), the issuer
//! and audiences.

use std::path::{Path, PathBuf};

use anyhow::Context;
use base64::Engine;
use clap::Args;
use shepherd_apiserver::serviceaccount::{self, ServiceAccountTokens};

#[derive(Args, Clone, Debug)]
pub struct ServiceAccountArgs {
    /// The private key that signs ServiceAccount tokens (PEM: ECDSA P-256 or P-384 in PKCS#8, signing
    /// ES256/ES384; RSA in PKCS#8 or PKCS#1, signing RS256); by default an ECDSA P-256 key generated
    /// into <data-dir>/pki/sa.key on first start. Also spelled as kube-apiserver's
    /// --service-account-signing-key-file.
    #[arg(long, visible_alias = "service-account-signing-key-file", value_name = "FILE")]
    pub service_account_key_file: Option<PathBuf>,
    /// The issuer (`iss`) of ServiceAccount tokens, and the audience a token gets when none is asked for.
    #[arg(long, default_value = serviceaccount::DEFAULT_ISSUER)]
    pub service_account_issuer: String,
    /// Audiences the API accepts in ServiceAccount tokens (repeatable; default: the issuer).
    #[arg(long = "api-audiences", value_delimiter = ',', value_name = "AUDIENCE")]
    pub api_audiences: Vec<String>,
    /// The shortest lifetime a TokenRequest may ask for, in seconds (Kubernetes: 600). Lowered only
    /// by tests that watch a token expire.
    #[arg(long, default_value_t = 600, hide = true)]
    pub service_account_min_expiration_seconds: i64,
}


impl ServiceAccountArgs {
    /// The token signer of a server whose data dir is `data_dir` (its `pki` directory exists).
    pub fn tokens(&self, data_dir: &Path) -> anyhow::Result<ServiceAccountTokens> {
        let pem = match &self.service_account_key_file {
            Some(path) => std::fs::read_to_string(path)
                .with_context(|| format!("reading --service-account-key-file {}", path.display()))?,
            None => {
                let path = data_dir.join("pki").join("sa.key");
                match std::fs::read_to_string(&path) {
                    Ok(pem) => pem,
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                        let pem = serviceaccount::generate_key_pem()?;
                        crate::credentials::write_private(&path, &pem)?;
                        tracing::info!(path = %path.display(), "generated the service account signing key");
                        pem
                    }
                    Err(e) => return Err(e).with_context(|| format!("reading {}", path.display())),
                }
            }
        };
        let tokens = ServiceAccountTokens::new(&pem, &self.service_account_issuer, self.api_audiences.clone())
            .context("the service account signing key")?;
        Ok(tokens.with_min_expiration_seconds(self.service_account_min_expiration_seconds))
    }
}

/// Certificates (DER) as one PEM bundle, as `kube-root-ca.crt` holds them.
pub fn pem_bundle(certificates: &[Vec<u8>]) -> String {
    let mut out = String::new();
    for der in certificates {
        let b64 = base64::engine::general_purpose::STANDARD.encode(der);
        out.push_str("-----BEGIN CERTIFICATE-----\n");
        for line in b64.as_bytes().chunks(64) {
            out.push_str(&String::from_utf8_lossy(line));
            out.push('\n');
        }
        out.push_str("-----END CERTIFICATE-----\n");
    }
    out
}
