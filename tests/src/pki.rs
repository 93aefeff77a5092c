//! A throwaway PKI for TLS tests, generated per test with rcgen: a CA, a server certificate for
//! `localhost` and `127.0.0.1`, client certificates (good, expired, from a foreign CA), and
//! the PEM files external tools (curl, nghttp) need.

use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose, date_time_ymd,
};

/// A certificate and its private key, as PEM.
#[derive(Clone, Debug)]
pub struct Identity {
    /// The certificate chain (leaf only; the CA is the trust anchor).
    pub cert: String,
    /// The private key.
    pub key: String,
}

/// A test CA that signs leaf certificates.
pub struct Ca {
    /// The CA certificate (PEM): the trust anchor.
    pub cert: String,
    issuer: Issuer<'static, KeyPair>,
}

impl Ca {
    /// A fresh CA named `name`.
    pub fn new(name: &str) -> Self {
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("CA params");
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        params.distinguished_name.push(DnType::CommonName, name);
        let key = KeyPair::generate().expect("CA key");
        let cert = params.self_signed(&key).expect("CA certificate").pem();
        Self {
            cert,
            issuer: Issuer::new(params, key),
        }
    }

    /// A server certificate for `localhost` and `127.0.0.1`.
    pub fn server(&self) -> Identity {
        self.leaf(
            &["localhost", "127.0.0.1"],
            ExtendedKeyUsagePurpose::ServerAuth,
            false,
        )
    }

    /// A server certificate for `names` (DNS names or IP addresses).
    pub fn server_for(&self, names: &[&str]) -> Identity {
        self.leaf(names, ExtendedKeyUsagePurpose::ServerAuth, false)
    }

    /// A client certificate whose DNS name (the peer identity handlers see) is `name`.
    pub fn client(&self, name: &str) -> Identity {
        self.leaf(&[name], ExtendedKeyUsagePurpose::ClientAuth, false)
    }

    /// A client certificate that expired in 2021.
    pub fn expired_client(&self, name: &str) -> Identity {
        self.leaf(&[name], ExtendedKeyUsagePurpose::ClientAuth, true)
    }

    fn leaf(&self, names: &[&str], usage: ExtendedKeyUsagePurpose, expired: bool) -> Identity {
        let names: Vec<String> = names.iter().map(|n| (*n).to_owned()).collect();
        let mut params = CertificateParams::new(names.clone()).expect("leaf params");
        // A leaf named like its issuer looks self-signed to OpenSSL (curl).
        params
            .distinguished_name
            .push(DnType::CommonName, names[0].as_str());
        params.extended_key_usages = vec![usage];
        params.use_authority_key_identifier_extension = true;
        if expired {
            params.not_before = date_time_ymd(2020, 1, 1);
            params.not_after = date_time_ymd(2021, 1, 1);
        }
        let key = KeyPair::generate().expect("leaf key");
        let cert = params
            .signed_by(&key, &self.issuer)
            .expect("leaf certificate");
        Identity {
            cert: cert.pem(),
            key: key.serialize_pem(),
        }
    }
}

/// A directory for PEM files, removed when dropped.
pub struct PemDir {
    path: PathBuf,
}

impl PemDir {
    /// A new empty directory under the system's temporary directory.
    pub fn new() -> Self {
        static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let path = std::env::temp_dir().join(format!("tensorwire-pki-{}-{n}", std::process::id()));
        std::fs::create_dir_all(&path).expect("create the PEM directory");
        Self { path }
    }

    /// Writes `contents` to `name` in the directory; its path.
    pub fn write(&self, name: &str, contents: &str) -> PathBuf {
        let path = self.path.join(name);
        std::fs::write(&path, contents).expect("write a PEM file");
        path
    }

    /// The directory.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Default for PemDir {
    fn default() -> Self {
        Self::new()
    }
}

impl Drop for PemDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.path);
    }
}
