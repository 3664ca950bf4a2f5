//! Canonical JSON (RFC 8785, numbers exact) and `Fingerprint::json` on any bytes: never a
//! panic; an accepted text's canonical form is valid JSON, canonical itself,
//! and fingerprints as the text does, as does the same document re-spelled
//! (pretty-printed, other number spellings, other escapes).
#![no_main]

use idem_core::{Fingerprint, InvalidInput, canonical_json};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    // Invalid UTF-8 as the lossy text too, so every input reaches the parser.
    let text = String::from_utf8_lossy(data);
    let canonical = match canonical_json(&text) {
        Ok(canonical) => canonical,
        Err(InvalidInput::Malformed { .. }) => {
            assert!(
                Fingerprint::json(&text).is_err(),
                "fingerprinted a refused text"
            );
            return;
        }
        Err(other) => panic!("an error other than Malformed: {other:?}"),
    };
    assert_eq!(
        canonical_json(&canonical).as_deref(),
        Ok(canonical.as_str()),
        "the canonical form is not canonical"
    );
    let fingerprint = Fingerprint::json(&text).expect("canonicalised, then refused");
    assert_eq!(fingerprint, Fingerprint::of_bytes(canonical.as_bytes()));

    // The same document in other whitespace.
    let padded = format!(" \n\t{text}\r\n ");
    assert_eq!(Fingerprint::json(&padded), Ok(fingerprint));

    // The same document as serde_json reads and re-writes it: pretty-printed,
    // members in another order, escapes spelled its own way (numbers keep
    // their text: `arbitrary_precision`).
    let value: serde_json::Value = match serde_json::from_str(&canonical) {
        Ok(value) => value,
        // serde_json nests one level less deep than the canonicaliser allows.
        Err(e) if e.to_string().contains("recursion limit") => return,
        Err(e) => panic!("the canonical form is not JSON: {e}"),
    };
    let pretty = serde_json::to_string_pretty(&value).expect("a parsed value serialises");
    assert_eq!(
        Fingerprint::json(&pretty),
        Ok(fingerprint),
        "re-spelled {pretty}"
    );
});
