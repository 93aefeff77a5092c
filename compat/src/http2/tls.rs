//! TLS for the HTTP/2 transport: rustls with the ring provider chosen explicitly, TLS 1.3 only,
//! ALPN `h2` only, optional client certificates checked against a CA, and the peer identity
//! read from a verified certificate.

use std::path::Path;
use std::sync::Arc;

use rustls::crypto::CryptoProvider;
use rustls::server::WebPkiClientVerifier;
use rustls::{ClientConfig, RootCertStore, ServerConfig};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use tensorwire_proto::transport::Error;

/// The only application protocol spoken over TLS.
pub(crate) const ALPN_H2: &[u8] = b"h2";

/// TLS settings of one node: its own certificate (served to clients, and shown to servers
/// that ask for a client certificate), the CA its peers' certificates must chain to, and
/// whether clients must present one.
#[derive(Clone)]
pub struct TlsConfig {
    pub(crate) server: Option<Arc<ServerConfig>>,
    pub(crate) client: Arc<ClientConfig>,
    pub(crate) server_name: Option<String>,
    pub(crate) client_auth: bool,
}

impl std::fmt::Debug for TlsConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TlsConfig")
            .field("serves", &self.server.is_some())
            .field("server_name", &self.server_name)
            .field("client_auth", &self.client_auth)
            .finish_non_exhaustive()
    }
}

/// Builds a [`TlsConfig`] from PEM.
#[derive(Debug, Default)]
pub struct TlsConfigBuilder {
    identity: Option<(Vec<u8>, Vec<u8>)>,
    trust: Option<Vec<u8>>,
    require_client_cert: bool,
    server_name: Option<String>,
}

impl TlsConfig {
    /// Starts a configuration.
    pub fn builder() -> TlsConfigBuilder {
        TlsConfigBuilder::default()
    }

    /// From the environment, if `TENSORWIRE_TLS_CERT` is set:
    ///
    /// | variable | meaning |
    /// |---|---|
    /// | `TENSORWIRE_TLS_CERT` | PEM file with this node's certificate chain |
    /// | `TENSORWIRE_TLS_KEY` | PEM file with its private key |
    /// | `TENSORWIRE_TLS_CA` | PEM file with the CA(s) peers' certificates must chain to |
    /// | `TENSORWIRE_TLS_REQUIRE_CLIENT_CERT` | `1`: clients must present a certificate from that CA |
    /// | `TENSORWIRE_TLS_SERVER_NAME` | the name servers' certificates must carry (default: the peer's IP address) |
    ///
    /// # Errors
    ///
    /// [`Error::Config`]-like [`Error::Misuse`] naming the variable or file that is wrong.
    pub fn from_env() -> Result<Option<Self>, Error> {
        let Some(cert) = std::env::var_os("TENSORWIRE_TLS_CERT") else {
            return Ok(None);
        };
        let key = std::env::var_os("TENSORWIRE_TLS_KEY")
            .ok_or_else(|| misuse("TENSORWIRE_TLS_CERT is set but TENSORWIRE_TLS_KEY is not"))?;
        let mut builder = Self::builder().identity_pem(read(&cert)?, read(&key)?);
        if let Some(ca) = std::env::var_os("TENSORWIRE_TLS_CA") {
            builder = builder.trust_pem(read(&ca)?);
        }
        let require =
            std::env::var("TENSORWIRE_TLS_REQUIRE_CLIENT_CERT").is_ok_and(|v| v.trim() == "1");
        builder = builder.require_client_cert(require);
        if let Ok(name) = std::env::var("TENSORWIRE_TLS_SERVER_NAME") {
            builder = builder.server_name(name.trim());
        }
        builder.build().map(Some)
    }

    /// Whether clients must present a certificate.
    pub fn requires_client_cert(&self) -> bool {
        self.client_auth
    }

    /// Whether it can serve TLS (it has a certificate of its own).
    pub fn serves(&self) -> bool {
        self.server.is_some()
    }
}

impl TlsConfigBuilder {
    /// This node's certificate chain and private key (PEM). Needed to serve TLS; also
    /// presented as the client certificate when a server asks for one.
    pub fn identity_pem(mut self, cert_chain: impl Into<Vec<u8>>, key: impl Into<Vec<u8>>) -> Self {
        self.identity = Some((cert_chain.into(), key.into()));
        self
    }

    /// The CA certificate(s) (PEM) that servers' certificates — and, with
    /// [`TlsConfigBuilder::require_client_cert`], clients' — must chain to.
    pub fn trust_pem(mut self, ca: impl Into<Vec<u8>>) -> Self {
        self.trust = Some(ca.into());
        self
    }

    /// Clients must present a certificate chaining to the trusted CA (mutual TLS); handlers
    /// see its name as the request's identity.
    pub fn require_client_cert(mut self, require: bool) -> Self {
        self.require_client_cert = require;
        self
    }

    /// The name servers' certificates must be valid for (default: the IP address connected to).
    pub fn server_name(mut self, name: impl Into<String>) -> Self {
        self.server_name = Some(name.into());
        self
    }

    /// Builds the rustls configurations.
    ///
    /// # Errors
    ///
    /// [`Error::Misuse`] saying which PEM is unreadable or which combination is incomplete.
    pub fn build(self) -> Result<TlsConfig, Error> {
        let provider = Arc::new(super::record_copy::provider());
        let identity = match &self.identity {
            Some((chain, key)) => {
                Some((certificates(chain, "certificate chain")?, private_key(key)?))
            }
            None => None,
        };
        let roots = match &self.trust {
            Some(ca) => {
                let mut roots = RootCertStore::empty();
                for cert in certificates(ca, "CA")? {
                    roots
                        .add(cert)
                        .map_err(|e| misuse(format!("the CA certificate is not usable: {e}")))?;
                }
                Some(Arc::new(roots))
            }
            None => None,
        };
        if self.require_client_cert && roots.is_none() {
            return Err(misuse(
                "requiring client certificates needs a CA to check them against",
            ));
        }
        let server = match &identity {
            Some((chain, key)) => Some(Arc::new(server_config(
                &provider,
                chain.clone(),
                key.clone_key(),
                roots.clone().filter(|_| self.require_client_cert),
            )?)),
            None => None,
        };
        let client = Arc::new(client_config(&provider, roots, identity)?);
        Ok(TlsConfig {
            server,
            client,
            server_name: self.server_name,
            client_auth: self.require_client_cert,
        })
    }
}

fn server_config(
    provider: &Arc<CryptoProvider>,
    chain: Vec<CertificateDer<'static>>,
    key: PrivateKeyDer<'static>,
    client_roots: Option<Arc<RootCertStore>>,
) -> Result<ServerConfig, Error> {
    let builder = ServerConfig::builder_with_provider(Arc::clone(provider))
        .with_protocol_versions(&[&rustls::version::TLS13])
        .map_err(|e| misuse(format!("TLS 1.3 is not available: {e}")))?;
    let builder = match client_roots {
        Some(roots) => {
            let verifier = WebPkiClientVerifier::builder_with_provider(roots, Arc::clone(provider))
                .build()
                .map_err(|e| misuse(format!("cannot check client certificates: {e}")))?;
            builder.with_client_cert_verifier(verifier)
        }
        None => builder.with_no_client_auth(),
    };
    let mut config = builder.with_single_cert(chain, key).map_err(|e| {
        misuse(format!(
            "the certificate and key do not make a TLS identity: {e}"
        ))
    })?;
    config.alpn_protocols = vec![ALPN_H2.to_vec()];
    Ok(config)
}

fn client_config(
    provider: &Arc<CryptoProvider>,
    roots: Option<Arc<RootCertStore>>,
    identity: Option<(Vec<CertificateDer<'static>>, PrivateKeyDer<'static>)>,
) -> Result<ClientConfig, Error> {
    let builder = ClientConfig::builder_with_provider(Arc::clone(provider))
        .with_protocol_versions(&[&rustls::version::TLS13])
        .map_err(|e| misuse(format!("TLS 1.3 is not available: {e}")))?
        // Without a CA nothing can be verified: every server certificate is refused.
        .with_root_certificates(roots.unwrap_or_else(|| Arc::new(RootCertStore::empty())));
    let mut config = match identity {
        Some((chain, key)) => builder
            .with_client_auth_cert(chain, key)
            .map_err(|e| misuse(format!("the client certificate is not usable: {e}")))?,
        None => builder.with_no_client_auth(),
    };
    config.alpn_protocols = vec![ALPN_H2.to_vec()];
    Ok(config)
}

/// The name of a verified peer certificate: its first DNS subject alternative name, else
/// `None` (the certificate was verified; it just has no DNS name).
pub(crate) fn identity(certificates: Option<&[CertificateDer<'_>]>) -> Option<String> {
    let cert = certificates?.first()?;
    let parsed = webpki::EndEntityCert::try_from(cert).ok()?;
    parsed.valid_dns_names().next().map(str::to_owned)
}

fn certificates(pem: &[u8], what: &str) -> Result<Vec<CertificateDer<'static>>, Error> {
    let certs = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| misuse(format!("the {what} PEM is unreadable: {e}")))?;
    if certs.is_empty() {
        return Err(misuse(format!("the {what} PEM holds no certificate")));
    }
    Ok(certs)
}

fn private_key(pem: &[u8]) -> Result<PrivateKeyDer<'static>, Error> {
    PrivateKeyDer::from_pem_slice(pem)
        .map_err(|e| misuse(format!("the private key PEM is unreadable: {e}")))
}

fn read(path: &std::ffi::OsStr) -> Result<Vec<u8>, Error> {
    std::fs::read(Path::new(path))
        .map_err(|e| misuse(format!("cannot read {}: {e}", Path::new(path).display())))
}

fn misuse(text: impl Into<String>) -> Error {
    Error::Misuse(text.into())
}
