//! The interception CA's leaves, chosen by the ClientHello's SNI (the CA itself is
//! `berth-ca`'s, kept in the state dir's `egress-ca`).

use std::sync::Arc;

use berth_ca::CertificateAuthority;
use rustls::sign::CertifiedKey;

/// Gives rustls the leaf for the ClientHello's SNI.
#[derive(Debug)]
pub(crate) struct LeafResolver(pub(crate) Arc<CertificateAuthority>);

impl rustls::server::ResolvesServerCert for LeafResolver {
    fn resolve(&self, hello: rustls::server::ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        let name = crate::policy::normalize_hostname(hello.server_name()?)?;
        self.0
            .leaf(&name)
            .inspect_err(
                |e| tracing::warn!(%name, error = %e, "cannot issue an egress leaf certificate"),
            )
            .ok()
    }
}
