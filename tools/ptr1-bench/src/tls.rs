//! TLS for the fixture: certificates from files, or a throwaway CA and server certificate
//! generated at start (`--tls-self-signed DIR` writes the CA to `DIR/ca.pem` for clients).

use std::path::Path;

use anyhow::{Context, Result};
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};
use tensorwire_compat::TlsConfig;

use crate::Options;

/// The server's TLS configuration, if the options ask for TLS.
pub(crate) fn server(options: &Options) -> Result<Option<TlsConfig>> {
    let (cert, key) = match (&options.cert, &options.key, &options.tls_self_signed) {
        (Some(cert), Some(key), _) => (read(cert)?, read(key)?),
        (None, None, Some(dir)) => self_signed(Path::new(dir), options.listen.ip())?,
        (None, None, None) => return Ok(None),
        _ => anyhow::bail!("--cert and --key go together"),
    };
    let mut builder = TlsConfig::builder().identity_pem(cert, key);
    if let Some(ca) = &options.client_ca {
        builder = builder.trust_pem(read(ca)?).require_client_cert(true);
    }
    Ok(Some(builder.build()?))
}

/// A client's TLS configuration: trust `--ca`, present `--cert`/`--key` if given.
pub(crate) fn client(options: &Options) -> Result<TlsConfig> {
    let ca = options
        .ca
        .as_ref()
        .context("--transport tls needs --ca FILE (the server's CA)")?;
    let mut builder = TlsConfig::builder().trust_pem(read(ca)?);
    if let (Some(cert), Some(key)) = (&options.cert, &options.key) {
        builder = builder.identity_pem(read(cert)?, read(key)?);
    }
    Ok(builder.build()?)
}

fn read(path: &str) -> Result<Vec<u8>> {
    std::fs::read(path).with_context(|| format!("reading {path}"))
}

/// A CA and a server certificate for `localhost`, `127.0.0.1` and the address the fixture
/// listens on (a test-bed host's, with `suite --netns`); the CA goes to `dir/ca.pem`.
fn self_signed(dir: &Path, listen: std::net::IpAddr) -> Result<(Vec<u8>, Vec<u8>)> {
    let mut ca = CertificateParams::new(Vec::<String>::new())?;
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    // Distinct names: a leaf named like its issuer looks self-signed to OpenSSL.
    ca.distinguished_name
        .push(DnType::CommonName, "ptr1-bench fixture CA");
    let ca_key = KeyPair::generate()?;
    let ca_cert = ca.self_signed(&ca_key)?;
    let issuer = Issuer::new(ca, ca_key);
    let mut names = vec!["localhost".to_owned(), "127.0.0.1".to_owned()];
    if !listen.is_loopback() && !listen.is_unspecified() {
        names.push(listen.to_string());
    }
    let mut leaf = CertificateParams::new(names)?;
    leaf.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    leaf.distinguished_name
        .push(DnType::CommonName, "localhost");
    let key = KeyPair::generate()?;
    let cert = leaf.signed_by(&key, &issuer)?;
    std::fs::create_dir_all(dir)?;
    std::fs::write(dir.join("ca.pem"), ca_cert.pem())?;
    Ok((cert.pem().into_bytes(), key.serialize_pem().into_bytes()))
}
