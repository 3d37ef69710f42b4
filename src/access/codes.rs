//! Pairing codes and invites as text: made at random from an alphabet
//! without look-alikes, read back leniently (case, spaces, dashes), and
//! hashed for the store, which never sees the code itself.
//!
//! Pure functions (the randomness comes from the system's generator). This
//! module must never log a code.

use ring::digest::{digest, SHA256};
use ring::rand::{SecureRandom, SystemRandom};

/// Characters a code is made of: capital letters and digits without the
/// ones easily confused (0/O and 1/I/L are left out): 31 characters.
pub const ALPHABET: &[u8] = b"ABCDEFGHJKMNPQRSTUVWXYZ23456789";

/// Characters in a code: 31^10 is about 2^49.5 codes.
pub const CODE_LEN: usize = 10;

/// A fresh random code, or `None` if the system has no randomness.
pub fn generate() -> Option<String> {
    let rng = SystemRandom::new();
    let chars = ALPHABET;
    let mut code = String::with_capacity(CODE_LEN);
    while code.len() < CODE_LEN {
        let mut byte = [0u8; 1];
        rng.fill(&mut byte).ok()?;
        // Rejection sampling keeps every character equally likely.
        let value = usize::from(byte[0]);
        if value < 256 - 256 % chars.len() {
            code.push(char::from(chars[value % chars.len()]));
        }
    }
    Some(code)
}

/// The code in what someone typed: letters upper-cased, spaces and dashes
/// dropped; `None` unless that leaves exactly [`CODE_LEN`] characters of
/// the alphabet.
pub fn normalize(typed: &str) -> Option<String> {
    let code: String = typed
        .chars()
        .filter(|c| !c.is_whitespace() && *c != '-')
        .map(|c| c.to_ascii_uppercase())
        .collect();
    let valid = code.len() == CODE_LEN && code.bytes().all(|b| ALPHABET.contains(&b));
    valid.then_some(code)
}

/// What the store keeps of a code: the hex SHA-256 of its normal form.
pub fn hash(code: &str) -> String {
    digest(&SHA256, code.as_bytes())
        .as_ref()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// The hash of whatever someone typed: of the code when it is one, else of
/// the raw text (it matches nothing, and still counts as a wrong try).
pub fn hash_typed(typed: &str) -> String {
    match normalize(typed) {
        Some(code) => hash(&code),
        None => hash(&format!("not a code: {typed}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_are_long_random_and_unambiguous() {
        let codes: std::collections::HashSet<String> =
            (0..500).map(|_| generate().unwrap()).collect();
        assert_eq!(codes.len(), 500);
        for code in &codes {
            assert_eq!(code.len(), CODE_LEN);
            assert!(!code.contains(['0', 'O', '1', 'I', 'L']), "{code}");
            assert_eq!(normalize(code).as_deref(), Some(code.as_str()));
        }
        // Every character of the alphabet turns up.
        let seen: std::collections::HashSet<char> = codes.iter().flat_map(|c| c.chars()).collect();
        assert_eq!(seen.len(), 31);
    }

    #[test]
    fn typed_codes_are_read_leniently_and_hashed_stably() {
        assert_eq!(normalize(" abcd-efgh jk ").as_deref(), Some("ABCDEFGHJK"));
        assert_eq!(normalize("ABCDEFGHJ"), None, "too short");
        assert_eq!(normalize("ABCDEFGHJKM"), None, "too long");
        assert_eq!(normalize("ABCDEFGHJ0"), None, "0 is not in the alphabet");
        assert_eq!(hash("ABCDEFGHJK"), hash_typed("abcd efgh jk"));
        assert_eq!(hash("ABCDEFGHJK").len(), 64);
        assert_ne!(hash_typed("nonsense"), hash("NONSENSE"));
    }
}
