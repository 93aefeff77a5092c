//! The ring provider's TLS 1.3 suites, with each outgoing record's plaintext handed to the
//! encrypter in pieces of at most [`PIECE`] bytes.
//!
//! rustls's TLS 1.3 encrypter copies a record's plaintext (up to 16 KiB) into a new buffer
//! 5 bytes in, after the record header, and seals it there. It copies each chunk it is given
//! with one `memcpy`. From a few KiB up (2 KiB times the vector width over 16; measured: 4 KiB
//! copies take it, 2 KiB ones do not), glibc's `memcpy` uses `rep movsb` on CPUs that report
//! fast `rep movsb` (FSRM), and on AMD Zen 3 and 4 that instruction runs at about a sixth of
//! the speed of a vector loop when the destination sits a little after the source within a
//! cache line (`docs/benchmarks.md`, "HTTP/2: the record copy"). Here the destination is
//! 5 bytes past whatever the allocator returned, so many records took the slow path: on the
//! sending side of a TLS transfer that copy took more time than AES-GCM.
//!
//! Splitting the plaintext into pieces changes nothing on the wire and nothing in the
//! cryptography — the same ring encrypter seals the same bytes with the same nonce — but each
//! piece is copied by glibc's vector code, whose speed does not depend on alignment. The
//! decrypter, the key schedule, the key extraction and QUIC are the ring provider's own.

use std::sync::OnceLock;

use rustls::crypto::CryptoProvider;
use rustls::crypto::cipher::{
    AeadKey, Iv, MessageDecrypter, MessageEncrypter, OutboundChunks, OutboundOpaqueMessage,
    OutboundPlainMessage, Tls13AeadAlgorithm, UnsupportedOperationError,
};
use rustls::{CipherSuiteCommon, ConnectionTrafficSecrets, SupportedCipherSuite, Tls13CipherSuite};

/// The largest piece copied with one `memcpy`: under glibc's `rep movsb` threshold on every
/// x86-64 variant (2 KiB and up), and within the size glibc copies with straight-line vector
/// moves when vectors are 64 bytes wide. Measured in `docs/benchmarks.md`.
pub(crate) const PIECE: usize = 512;

/// The ring provider with every suite's encrypter copying in pieces; everything else (key
/// exchange, signatures, randomness) is the ring provider's.
pub(crate) fn provider() -> CryptoProvider {
    // rustls needs `'static` suites: each wrapped suite is made once per process and kept
    // (three small structs for the ring provider).
    static SUITES: OnceLock<Vec<SupportedCipherSuite>> = OnceLock::new();
    let mut provider = rustls::crypto::ring::default_provider();
    let suites = SUITES.get_or_init(|| {
        provider
            .cipher_suites
            .iter()
            .map(|s| piecewise(*s))
            .collect()
    });
    provider.cipher_suites = suites.clone();
    provider
}

/// The same suite with its AEAD wrapped; a TLS 1.2 suite, should a build of rustls offer
/// any, unchanged.
fn piecewise(suite: SupportedCipherSuite) -> SupportedCipherSuite {
    let Some(inner) = tls13(suite) else {
        return suite;
    };
    let aead: &'static PiecewiseAead = Box::leak(Box::new(PiecewiseAead {
        inner: inner.aead_alg,
    }));
    SupportedCipherSuite::Tls13(Box::leak(Box::new(Tls13CipherSuite {
        common: CipherSuiteCommon {
            suite: inner.common.suite,
            hash_provider: inner.common.hash_provider,
            confidentiality_limit: inner.common.confidentiality_limit,
        },
        hkdf_provider: inner.hkdf_provider,
        aead_alg: aead,
        quic: inner.quic,
    })))
}

/// The TLS 1.3 suite inside `suite`, if it is one. (The transport speaks TLS 1.3 only; TLS 1.2
/// suites exist when another crate turns on rustls's `tls12` feature.)
#[allow(unreachable_patterns)]
fn tls13(suite: SupportedCipherSuite) -> Option<&'static Tls13CipherSuite> {
    match suite {
        SupportedCipherSuite::Tls13(inner) => Some(inner),
        _ => None,
    }
}

/// An AEAD whose encrypters hand the plaintext over in pieces; the rest is delegated.
struct PiecewiseAead {
    inner: &'static dyn Tls13AeadAlgorithm,
}

impl Tls13AeadAlgorithm for PiecewiseAead {
    fn encrypter(&self, key: AeadKey, iv: Iv) -> Box<dyn MessageEncrypter> {
        Box::new(PiecewiseEncrypter {
            inner: self.inner.encrypter(key, iv),
        })
    }

    fn decrypter(&self, key: AeadKey, iv: Iv) -> Box<dyn MessageDecrypter> {
        self.inner.decrypter(key, iv)
    }

    fn key_len(&self) -> usize {
        self.inner.key_len()
    }

    fn extract_keys(
        &self,
        key: AeadKey,
        iv: Iv,
    ) -> Result<ConnectionTrafficSecrets, UnsupportedOperationError> {
        self.inner.extract_keys(key, iv)
    }

    fn fips(&self) -> bool {
        self.inner.fips()
    }
}

struct PiecewiseEncrypter {
    inner: Box<dyn MessageEncrypter>,
}

impl MessageEncrypter for PiecewiseEncrypter {
    fn encrypt(
        &mut self,
        msg: OutboundPlainMessage<'_>,
        seq: u64,
    ) -> Result<OutboundOpaqueMessage, rustls::Error> {
        if msg.payload.len() <= PIECE {
            return self.inner.encrypt(msg, seq);
        }
        let pieces = pieces(&msg.payload);
        let piecewise = OutboundPlainMessage {
            typ: msg.typ,
            version: msg.version,
            payload: OutboundChunks::new(&pieces),
        };
        self.inner.encrypt(piecewise, seq)
    }

    fn encrypted_payload_len(&self, payload_len: usize) -> usize {
        self.inner.encrypted_payload_len(payload_len)
    }
}

/// The bytes of `payload`, in order, as slices of at most [`PIECE`] bytes. A record holds at
/// most 16 KiB of plaintext, so this is about 33 slices, one small allocation per record.
fn pieces<'a>(payload: &OutboundChunks<'a>) -> Vec<&'a [u8]> {
    let mut out = Vec::with_capacity(payload.len() / PIECE + 2);
    match *payload {
        OutboundChunks::Single(chunk) => out.extend(chunk.chunks(PIECE)),
        OutboundChunks::Multiple { chunks, start, end } => {
            // The bytes `start..end` of the concatenated chunks.
            let mut offset = 0;
            for &chunk in chunks {
                let (chunk_start, chunk_end) = (offset, offset + chunk.len());
                offset = chunk_end;
                if chunk_end <= start || chunk_start >= end {
                    continue;
                }
                let from = start.saturating_sub(chunk_start);
                let to = end.min(chunk_end) - chunk_start;
                out.extend(chunk[from..to].chunks(PIECE));
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn flatten(pieces: &[&[u8]]) -> Vec<u8> {
        pieces.concat()
    }

    #[test]
    fn pieces_keep_every_byte_in_order_and_none_is_longer_than_a_piece() {
        let data: Vec<u8> = (0..20_000u32).map(|i| (i % 251).to_le_bytes()[0]).collect();
        let single = OutboundChunks::Single(&data);
        let got = pieces(&single);
        assert_eq!(flatten(&got), data);
        assert!(got.iter().all(|p| !p.is_empty() && p.len() <= PIECE));

        let parts: [&[u8]; 4] = [&data[..9], &data[9..5000], &data[5000..5000], &data[5000..]];
        for (start, end) in [
            (0, 20_000),
            (3, 17_000),
            (9, 9),
            (4_999, 5_001),
            (12, 20_000),
        ] {
            let multiple = OutboundChunks::Multiple {
                chunks: &parts,
                start,
                end,
            };
            let got = pieces(&multiple);
            assert_eq!(flatten(&got), data[start..end], "{start}..{end}");
            assert!(got.iter().all(|p| !p.is_empty() && p.len() <= PIECE));
        }
    }

    #[test]
    fn every_tls13_suite_is_wrapped_once_and_the_rest_are_unchanged() {
        let ring = rustls::crypto::ring::default_provider();
        let ours = provider();
        assert_eq!(ours.cipher_suites.len(), ring.cipher_suites.len());
        for (mine, theirs) in ours.cipher_suites.iter().zip(&ring.cipher_suites) {
            assert_eq!(mine.suite(), theirs.suite());
            let (m, t) = match (tls13(*mine), tls13(*theirs)) {
                (Some(m), Some(t)) => (m, t),
                (None, None) => continue, // TLS 1.2 (rustls's `tls12`): passed through
                _ => panic!("{:?} changed its protocol version", mine.suite()),
            };
            assert!(!std::ptr::eq(m, t), "{:?} is not wrapped", m.common.suite);
            assert_eq!(
                m.common.confidentiality_limit,
                t.common.confidentiality_limit
            );
        }
        let again = provider();
        for (a, b) in ours.cipher_suites.iter().zip(&again.cipher_suites) {
            if let (Some(a), Some(b)) = (tls13(*a), tls13(*b)) {
                assert!(std::ptr::eq(a, b), "a suite was wrapped twice");
            }
        }
    }

    /// The wrapped encrypter seals exactly what the ring encrypter seals: the same record
    /// bytes for the same key, nonce and plaintext, whatever the chunking.
    #[test]
    fn a_record_sealed_in_pieces_is_byte_for_byte_the_ring_record() {
        let ring = rustls::crypto::ring::default_provider();
        let ours = provider();
        let data: Vec<u8> = (0..16_384u32).map(|i| (i * 7).to_le_bytes()[0]).collect();
        let parts: [&[u8]; 3] = [&data[..9], &data[9..10_000], &data[10_000..]];
        let mut checked = 0;
        for (mine, theirs) in ours.cipher_suites.iter().zip(&ring.cipher_suites) {
            let (Some(mine), Some(theirs)) = (tls13(*mine), tls13(*theirs)) else {
                continue; // TLS 1.2: not wrapped
            };
            // rustls offers no public way to make a key shorter than 32 bytes.
            if theirs.aead_alg.key_len() != 32 {
                continue;
            }
            checked += 1;
            let iv = || Iv::from([7u8; 12]);
            let mut a = mine.aead_alg.encrypter(AeadKey::from([0x42; 32]), iv());
            let mut b = theirs.aead_alg.encrypter(AeadKey::from([0x42; 32]), iv());
            for payload in [
                OutboundChunks::Single(&data),
                OutboundChunks::new(&parts),
                OutboundChunks::Single(&data[..100]),
            ] {
                let plain = |payload| OutboundPlainMessage {
                    typ: rustls::ContentType::ApplicationData,
                    version: rustls::ProtocolVersion::TLSv1_3,
                    payload,
                };
                let sealed_a = a.encrypt(plain(payload.clone()), 5).unwrap().encode();
                let sealed_b = b.encrypt(plain(payload), 5).unwrap().encode();
                assert_eq!(sealed_a, sealed_b, "{:?}", mine.common.suite);
            }
        }
        assert_eq!(checked, 2, "AES-256-GCM and ChaCha20-Poly1305");
    }
}
