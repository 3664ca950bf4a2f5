//! A stored checkpoint's name and JSON data (`decode_checkpoint`): any pair,
//! either part absent, is a checkpoint, nothing, or `InvalidInput` (which a
//! store reports as `Corrupt`), never a panic; an accepted checkpoint stores
//! and reads back equal.
//!
//! Input: one flag byte (bit 0: a name is stored, bit 1: data is stored; the
//! digits `0` to `3` are these), then the name, `\n`, and the data; invalid
//! UTF-8 is read lossily.
#![no_main]

use idem_core::MAX_CHECKPOINT_BYTES;
use idem_core::store::{checkpoint_json, decode_checkpoint};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&flags, rest)) = data.split_first() else {
        return;
    };
    let text = String::from_utf8_lossy(rest);
    let (name, json) = text.split_once('\n').unwrap_or((&text, ""));
    let name = (flags & 1 != 0).then_some(name);
    let json = (flags & 2 != 0).then_some(json);
    match decode_checkpoint(name, json) {
        Ok(None) => assert!(name.is_none() && json.is_none()),
        Ok(Some(point)) => {
            assert_eq!(Some(point.name()), name);
            let stored = checkpoint_json(&point);
            assert!(stored.len() <= MAX_CHECKPOINT_BYTES);
            assert_eq!(
                decode_checkpoint(Some(point.name()), Some(&stored)),
                Ok(Some(point.clone())),
                "stored as {stored}"
            );
        }
        Err(_) => assert!(name.is_some() || json.is_some()),
    }
});
