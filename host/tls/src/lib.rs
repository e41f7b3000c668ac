//! The TLS client configuration every outbound HTTPS connection of the host
//! uses: a plugin's granted host (`warden-sandbox`'s network), a model
//! provider (`warden-providers`' HTTP client) and a remote MCP server
//! (`warden-engine`'s `mcp_servers/remote.rs`). One place, so the three
//! cannot come to trust different roots or protocol versions.
//!
//! It is a crate of its own, below the three, because they share no other
//! crate that is about connections (`warden-syntax` is about text), and a
//! crate that names only `rustls` and `webpki-roots`, which all three
//! already use, costs nothing to build.

use std::sync::{Arc, OnceLock};

/// The TLS client configuration: rustls with the `ring` provider, its safe
/// default protocol versions, the Mozilla root store from `webpki-roots`
/// and no client certificate. Built once per process; each call returns
/// the same value.
pub fn client_config() -> Arc<rustls::ClientConfig> {
    static CONFIG: OnceLock<Arc<rustls::ClientConfig>> = OnceLock::new();
    Arc::clone(CONFIG.get_or_init(|| {
        let roots = rustls::RootCertStore {
            roots: webpki_roots::TLS_SERVER_ROOTS.into(),
        };
        let config = rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .expect("ring supports the default protocol versions")
        .with_root_certificates(roots)
        .with_no_client_auth();
        Arc::new(config)
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_configuration_is_built_once_and_sends_no_client_certificate() {
        let config = client_config();
        // Every connection shares the one value (and its session cache).
        assert!(Arc::ptr_eq(&config, &client_config()));
        assert!(!config.client_auth_cert_resolver.has_certs());
    }
}
