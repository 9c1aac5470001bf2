//! Certificates for the TLS tests, made by the test (rcgen): a CA, a server
//! certificate for 127.0.0.1 and localhost, a client certificate, and an
//! unrelated CA; written as PEM files into a folder removed on drop.
#![allow(dead_code)] // each includer uses its part

use rcgen::{
    BasicConstraints, Certificate, CertificateParams, ExtendedKeyUsagePurpose, IsCa, KeyPair,
    SanType,
};
use std::path::PathBuf;

pub struct TestCerts {
    pub dir: PathBuf,
}

impl TestCerts {
    pub fn new(tag: &str) -> TestCerts {
        let dir = std::env::temp_dir().join(format!("livereg-certs-{tag}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let certs = TestCerts { dir };
        let (ca, ca_key) = authority();
        let (other, _) = authority();
        certs.write("ca.pem", &ca.pem());
        certs.write("other-ca.pem", &other.pem());
        let server = leaf(ExtendedKeyUsagePurpose::ServerAuth, &ca, &ca_key);
        certs.write("server.pem", &server.0.pem());
        certs.write("server.key", &server.1.serialize_pem());
        let client = leaf(ExtendedKeyUsagePurpose::ClientAuth, &ca, &ca_key);
        certs.write("client.pem", &client.0.pem());
        certs.write("client.key", &client.1.serialize_pem());
        certs
    }

    /// The path of one of the files (`ca.pem`, `other-ca.pem`, `server.pem`,
    /// `server.key`, `client.pem`, `client.key`).
    pub fn path(&self, name: &str) -> String {
        self.dir.join(name).display().to_string()
    }

    pub fn read(&self, name: &str) -> Vec<u8> {
        std::fs::read(self.dir.join(name)).unwrap()
    }

    fn write(&self, name: &str, pem: &str) {
        std::fs::write(self.dir.join(name), pem).unwrap();
    }
}

impl Drop for TestCerts {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn authority() -> (Certificate, KeyPair) {
    let key = KeyPair::generate().unwrap();
    let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    (params.self_signed(&key).unwrap(), key)
}

fn leaf(
    usage: ExtendedKeyUsagePurpose,
    ca: &Certificate,
    ca_key: &KeyPair,
) -> (Certificate, KeyPair) {
    let key = KeyPair::generate().unwrap();
    let mut params = CertificateParams::new(vec!["localhost".to_owned()]).unwrap();
    params
        .subject_alt_names
        .push(SanType::IpAddress("127.0.0.1".parse().unwrap()));
    params.extended_key_usages = vec![usage];
    (params.signed_by(&key, ca, ca_key).unwrap(), key)
}
