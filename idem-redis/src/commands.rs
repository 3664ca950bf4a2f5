//! The Lua scripts, one per operation, each with its preludes, hashed once.

use std::sync::LazyLock;

use redis::Script;

/// Every script's prelude: `server_now()`, the server's clock in ms.
const NOW: &str = include_str!("../lua/now.lua");
/// The fenced scripts' prelude: `holds(now)`, whether `ARGV[1]` owns the record.
const FENCE: &str = include_str!("../lua/fence.lua");

/// Every script, with its preludes.
pub(crate) struct Scripts {
    /// `lua/claim.lua`: the decision table.
    pub(crate) claim: Script,
    /// `lua/complete.lua`.
    pub(crate) complete: Script,
    /// `lua/renew.lua`.
    pub(crate) renew: Script,
    /// `lua/release.lua`.
    pub(crate) release: Script,
    /// `lua/checkpoint.lua`.
    pub(crate) checkpoint: Script,
    /// `lua/get.lua`.
    pub(crate) get: Script,
    /// `lua/delete.lua`.
    pub(crate) delete: Script,
    /// The server's clock, on the node that holds `KEYS[1]` (in a cluster,
    /// each record is judged by its own node's clock).
    pub(crate) now: Script,
}

fn script(preludes: &[&str], body: &str) -> Script {
    Script::new(&format!("{}\n{body}", preludes.concat()))
}

/// The scripts the store runs, built on first use.
pub(crate) static SCRIPTS: LazyLock<Scripts> = LazyLock::new(|| Scripts {
    claim: script(&[NOW], include_str!("../lua/claim.lua")),
    complete: script(&[NOW, FENCE], include_str!("../lua/complete.lua")),
    renew: script(&[NOW, FENCE], include_str!("../lua/renew.lua")),
    release: script(&[NOW, FENCE], include_str!("../lua/release.lua")),
    checkpoint: script(&[NOW, FENCE], include_str!("../lua/checkpoint.lua")),
    get: script(&[NOW], include_str!("../lua/get.lua")),
    delete: script(&[NOW], include_str!("../lua/delete.lua")),
    now: script(&[NOW], "return server_now()"),
});

/// The journal's writing scripts' prelude: its indexes and fences.
const JOURNAL: &str = include_str!("../lua/journal.lua");

/// Every script of the journal store, with its preludes.
pub(crate) struct JournalScripts {
    /// `lua/journal_record.lua`.
    pub(crate) record: Script,
    /// `lua/journal_get.lua`.
    pub(crate) get: Script,
    /// `lua/journal_acquire.lua`.
    pub(crate) acquire: Script,
    /// `lua/journal_mark_sent.lua`.
    pub(crate) mark_sent: Script,
    /// `lua/journal_finish.lua`.
    pub(crate) finish: Script,
    /// `lua/journal_list.lua`.
    pub(crate) list: Script,
}

/// The journal's scripts, built on first use.
pub(crate) static JOURNAL_SCRIPTS: LazyLock<JournalScripts> = LazyLock::new(|| JournalScripts {
    record: script(&[NOW, JOURNAL], include_str!("../lua/journal_record.lua")),
    get: script(&[], include_str!("../lua/journal_get.lua")),
    acquire: script(&[NOW, JOURNAL], include_str!("../lua/journal_acquire.lua")),
    mark_sent: script(
        &[NOW, JOURNAL],
        include_str!("../lua/journal_mark_sent.lua"),
    ),
    finish: script(&[NOW, JOURNAL], include_str!("../lua/journal_finish.lua")),
    list: script(&[NOW], include_str!("../lua/journal_list.lua")),
});
