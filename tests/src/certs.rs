//! Test certificates made on the spot (rcgen): a CA and the certificates it signs, written as
//! PEM files, for the TLS tests of the API and the cluster port.

use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair, KeyUsagePurpose,
};

/// A certificate authority that signs server-and-client certificates.
pub struct TestCa {
    issuer: CertifiedIssuer<'static, KeyPair>,
}

/// PEM files of one certificate: chain, key, and the CA that signed it.
#[derive(Debug, Clone)]
pub struct CertFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
    pub ca: PathBuf,
}

impl TestCa {
    /// A new CA called `name`.
    pub fn new(name: &str) -> TestCa {
        let mut params = CertificateParams::new(Vec::new()).expect("params");
        params.distinguished_name.push(DnType::CommonName, name);
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let key = KeyPair::generate().expect("CA key");
        TestCa {
            issuer: CertifiedIssuer::self_signed(params, key).expect("CA certificate"),
        }
    }

    /// The CA certificate in PEM.
    pub fn pem(&self) -> String {
        self.issuer.pem()
    }

    /// Issues a certificate for `names` (DNS names or IP addresses), usable as TLS server and
    /// client, and writes `<stem>.crt`, `<stem>.key` and `<stem>-ca.crt` into `dir`.
    pub fn issue(&self, dir: &Path, stem: &str, names: &[&str]) -> CertFiles {
        let mut params =
            CertificateParams::new(names.iter().map(|s| s.to_string()).collect::<Vec<_>>())
                .expect("names");
        params.distinguished_name.push(DnType::CommonName, stem);
        params.extended_key_usages = vec![
            ExtendedKeyUsagePurpose::ServerAuth,
            ExtendedKeyUsagePurpose::ClientAuth,
        ];
        params.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
        ];
        let key = KeyPair::generate().expect("key");
        let cert = params.signed_by(&key, &self.issuer).expect("sign");
        let files = CertFiles {
            cert: dir.join(format!("{stem}.crt")),
            key: dir.join(format!("{stem}.key")),
            ca: dir.join(format!("{stem}-ca.crt")),
        };
        // Write-then-rename, as a rotating Secret volume does: readers never see half a file.
        for (path, pem) in [
            (&files.cert, cert.pem()),
            (&files.key, key.serialize_pem()),
            (&files.ca, self.pem()),
        ] {
            let tmp = path.with_extension("tmp");
            std::fs::write(&tmp, pem).expect("write pem");
            std::fs::rename(&tmp, path).expect("rename pem");
        }
        files
    }
}
