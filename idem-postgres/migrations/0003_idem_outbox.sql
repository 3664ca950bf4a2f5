-- idem: the transactional outbox's tables and functions (PostgreSQL 13+),
-- for PostgresOutbox.
--
-- Every statement is idempotent. Run this file as it is for the default table
-- name `idem_outbox`, or take PostgresOutbox::migration_sql(), which is this
-- text with the table name (and the notification channel) replaced, for
-- another name, and the partition count of the store's options in its last
-- statement.
--
-- Every time is a bigint of whole milliseconds since the Unix epoch, by the
-- server's clock_timestamp() (now() is frozen at the start of a transaction,
-- and an enqueue may run late inside a caller's long one).
--
-- The design. Messages form one log per partition (an aggregate's partition
-- is a stable hash of its name modulo the partition count), read by one
-- relay at a time through the partition's cursor: a relay reads a batch
-- after its cursor, publishes it, and moves the cursor past it once the
-- broker confirmed it (one row written), in the statement that reads a
-- later batch (idem_outbox_advance, then idem_outbox_read): one statement
-- per batch. A message in the log has no state (NULL): pending past its
-- partition's cursor, sent at or before it. A message that fails leaves the log for its
-- partition's retry lane (state 'waiting', then 'parked'), and so do the
-- later messages of its aggregate (held), until it is sent or dropped.
--
-- The log's order, and late commits. A message's place is (okey, pos): okey
-- is the enqueuing transaction's id, or the okey of its aggregate's previous
-- message if that is higher; pos is a sequence's next value, taken at the
-- insert. A read takes only messages whose okey is below the oldest
-- transaction id still running (the snapshot's xmin): every transaction that
-- could still commit a message has an id at or above it, and a message's
-- okey is at least its own transaction's id, so nothing committed later can
-- take a place before one read: no late commit is ever skipped (a
-- transaction that runs long holds every partition's relay back until it
-- ends). Within an aggregate, an enqueue takes the next sequence by updating
-- the aggregate's counter row, whose lock it holds until its transaction
-- ends: a second transaction enqueueing for the same aggregate waits for the
-- first, so sequences follow the commit order, and with okey carried over
-- from the previous message and pos taken after the wait, so does the log.

CREATE TABLE IF NOT EXISTS idem_outbox_aggregates (
    aggregate     text   PRIMARY KEY,
    last_sequence bigint NOT NULL
);
-- The okey of the aggregate's last message (an earlier version kept none).
ALTER TABLE idem_outbox_aggregates ADD COLUMN IF NOT EXISTS last_key bigint NOT NULL DEFAULT 0;

-- An earlier version's table (a lease per message) is replaced when nothing
-- in it waits to be published; otherwise the migration stops, and that
-- version's relay must drain it first.
DO $$
BEGIN
    PERFORM lease_owner FROM idem_outbox LIMIT 1;
    IF EXISTS (SELECT 1 FROM idem_outbox WHERE state IN ('pending', 'parked')) THEN
        RAISE EXCEPTION 'idem: the outbox table was made by an earlier version of idem and holds unsent messages'
            USING HINT = 'Publish or drop them with that version''s relay, then migrate again.';
    END IF;
    DROP TABLE idem_outbox;
EXCEPTION WHEN undefined_column OR undefined_table THEN
    NULL;
END
$$;

CREATE TABLE IF NOT EXISTS idem_outbox (
    pos           bigint GENERATED ALWAYS AS IDENTITY,
    okey          bigint NOT NULL,
    part          integer NOT NULL,
    id            uuid   PRIMARY KEY,
    aggregate     text   NOT NULL,
    sequence      bigint NOT NULL CHECK (sequence >= 1),
    kind          text   NOT NULL,
    header_names  text[] NOT NULL,
    header_values text[] NOT NULL,
    payload       bytea  NOT NULL,
    -- NULL in the log; MessageState::as_str in the retry lane or after it
    -- ('waiting', 'parked', 'sent', 'dropped'), unchecked here, so a state
    -- a later version adds needs no migration.
    state         text,
    attempts      bigint NOT NULL DEFAULT 0 CHECK (attempts BETWEEN 0 AND 4294967295),
    last_error    text,
    enqueued_at   bigint NOT NULL,
    available_at  bigint NOT NULL,
    sent_at       bigint,
    UNIQUE (aggregate, sequence)
);

-- Each partition's log, in its order: what a read walks after the cursor,
-- and a purge before it.
CREATE INDEX IF NOT EXISTS idem_outbox_log_idx ON idem_outbox (part, okey, pos)
    WHERE state IS NULL;
-- Each partition's retry lane, by aggregate: a read's test of a blocked
-- aggregate, and the heads a relay retries.
CREATE INDEX IF NOT EXISTS idem_outbox_lane_idx ON idem_outbox (part, aggregate, sequence)
    WHERE state IN ('waiting', 'parked');
CREATE INDEX IF NOT EXISTS idem_outbox_parked_idx ON idem_outbox (enqueued_at, id)
    WHERE state = 'parked';
-- A purge finds what left the lane by when it did: sent_at, the send or the
-- drop.
CREATE INDEX IF NOT EXISTS idem_outbox_finished_idx ON idem_outbox (sent_at)
    WHERE state IN ('sent', 'dropped');

-- One row per partition: its holder, its lease and its cursor.
CREATE TABLE IF NOT EXISTS idem_outbox_partitions (
    part        integer PRIMARY KEY CHECK (part >= 0),
    owner       uuid,
    lease_until bigint,
    cursor_key  bigint  NOT NULL DEFAULT 0,
    cursor_pos  bigint  NOT NULL DEFAULT 0
);

-- The server's clock in whole milliseconds: the one clock of every lease,
-- back-off and age.
CREATE OR REPLACE FUNCTION idem_outbox_now()
RETURNS bigint
LANGUAGE sql VOLATILE
AS $$
    SELECT (extract(epoch FROM date_trunc('milliseconds', clock_timestamp())) * 1000)::bigint
$$;

-- The oldest transaction id still running, as the statement's snapshot
-- sees it: a read takes only messages whose okey is below it.
CREATE OR REPLACE FUNCTION idem_outbox_xmin()
RETURNS bigint
LANGUAGE sql VOLATILE
AS $$
    SELECT (pg_snapshot_xmin(pg_current_snapshot())::text)::bigint
$$;

-- Up to p_limit messages of partition p_part's log after (p_key, p_pos),
-- in log order, below the oldest transaction still running (the snapshot's
-- xmin, so no late commit is ever passed), each with whether its
-- partition's cursor passed it and whether its aggregate has a message in
-- the retry lane (blocked): PostgresOutbox's read.
--
-- Both bounds of the walk are row comparisons naming the partition: beside
-- an equality on part, Postgres starts the scan at the partition's first
-- entry and walks every sent message still stored before the position.
-- Only if the lane holds anything (one probe for the call) is each
-- message's aggregate looked up in it. A function, so that its plan is made
-- once per session, whatever the position: as a statement, Postgres planned
-- it again at every batch, which cost as much as running it. No JIT: the
-- planner's guess for a large log would turn it on, and compiling costs
-- far more than the read. Its columns are PostgresOutbox's COLUMNS, in their
-- order, then passed and blocked.
CREATE OR REPLACE FUNCTION idem_outbox_read(
    p_part  integer,
    p_key   bigint,
    p_pos   bigint,
    p_limit bigint
)
RETURNS TABLE (
    o_id            uuid,
    o_aggregate     text,
    o_sequence      bigint,
    o_part          integer,
    o_okey          bigint,
    o_pos           bigint,
    o_kind          text,
    o_header_names  text[],
    o_header_values text[],
    o_payload       bytea,
    o_state         text,
    o_attempts      bigint,
    o_last_error    text,
    o_enqueued_at   bigint,
    o_available_at  bigint,
    o_sent_at       bigint,
    o_passed        boolean,
    o_blocked       boolean
)
LANGUAGE plpgsql VOLATILE
SET plan_cache_mode = force_generic_plan
SET jit = off
AS $$
BEGIN
    RETURN QUERY
    WITH x AS MATERIALIZED (SELECT idem_outbox_xmin() AS xmin),
    c AS MATERIALIZED (
        SELECT q.cursor_key, q.cursor_pos FROM idem_outbox_partitions AS q WHERE q.part = p_part
    ),
    lane AS MATERIALIZED (
        SELECT EXISTS (SELECT 1 FROM idem_outbox AS l
                       WHERE l.part = p_part AND l.state IN ('waiting', 'parked')) AS busy
    )
    SELECT r.id, r.aggregate, r.sequence, r.part, r.okey, r.pos, r.kind, r.header_names,
           r.header_values, r.payload, r.state, r.attempts, r.last_error, r.enqueued_at,
           r.available_at, r.sent_at,
           (r.state IS NULL AND (r.okey, r.pos) <= (c.cursor_key, c.cursor_pos)),
           CASE WHEN lane.busy THEN EXISTS (
               SELECT 1 FROM idem_outbox AS l
               WHERE l.part = r.part AND l.aggregate = r.aggregate
                 AND l.state IN ('waiting', 'parked')
           ) ELSE false END
    FROM idem_outbox AS r CROSS JOIN lane LEFT JOIN c ON true
    WHERE r.state IS NULL AND (r.part, r.okey, r.pos) > (p_part, p_key, p_pos)
      AND (r.part, r.okey) < (p_part, (SELECT x.xmin FROM x))
    ORDER BY r.part, r.okey, r.pos
    LIMIT p_limit;
END
$$;

-- Settles a batch under p_owner's lease of partition p_part: PostgresOutbox's
-- advance, alone, or with a read after it as its advance_and_read (one
-- statement: this function, and idem_outbox_read beside it in LATERAL on
-- its row, which so runs after it and, being VOLATILE, sees its writes).
-- Unless p_owner holds the partition it writes nothing and answers no row.
-- Otherwise the lease is renewed for p_lease and the cursor moves to
-- (p_to_key, p_to_pos), never back; each failed message (in the log, or
-- waiting in the lane, with the attempts it was read with) counts one more
-- attempt, keeps its error and is due again after its back-off (saturating
-- at the largest time a bigint holds), parked at its max; each held log
-- message moves to the lane, due at once; each sent lane message is marked
-- sent. Each write applies only to a message in the state it was read in,
-- so an advance delivered twice changes nothing more. It answers the
-- partition, the renewed lease and the cursor. Planned once per session,
-- without JIT, as the read is.
CREATE OR REPLACE FUNCTION idem_outbox_advance(
    p_part     integer,
    p_owner    uuid,
    p_lease    bigint,
    p_to_key   bigint,
    p_to_pos   bigint,
    p_failed   uuid[],
    p_attempts bigint[],
    p_errors   text[],
    p_retries  bigint[],
    p_max      bigint[],
    p_held     uuid[],
    p_sent     uuid[]
)
RETURNS TABLE (
    o_part        integer,
    o_lease_until bigint,
    o_cursor_key  bigint,
    o_cursor_pos  bigint
)
LANGUAGE plpgsql VOLATILE
SET plan_cache_mode = force_generic_plan
SET jit = off
AS $$
DECLARE
    v_now   bigint := idem_outbox_now();
    v_until bigint;
    v_key   bigint;
    v_pos   bigint;
BEGIN
    -- A NULL target compares as NULL: the cursor stays.
    UPDATE idem_outbox_partitions AS p SET lease_until = v_now + p_lease,
        cursor_key = CASE WHEN (p_to_key, p_to_pos) > (p.cursor_key, p.cursor_pos)
                          THEN p_to_key ELSE p.cursor_key END,
        cursor_pos = CASE WHEN (p_to_key, p_to_pos) > (p.cursor_key, p.cursor_pos)
                          THEN p_to_pos ELSE p.cursor_pos END
    WHERE p.part = p_part AND p.owner = p_owner AND p.lease_until > v_now
    RETURNING p.lease_until, p.cursor_key, p.cursor_pos INTO v_until, v_key, v_pos;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    IF cardinality(p_failed) > 0 THEN
        UPDATE idem_outbox AS r SET attempts = least(r.attempts + 1, 4294967295),
            last_error = e.error,
            available_at = v_now + least(e.retry, 9223372036854775807 - v_now),
            state = CASE WHEN least(r.attempts + 1, 4294967295) >= e.max
                         THEN 'parked' ELSE 'waiting' END
        FROM unnest(p_failed, p_attempts, p_errors, p_retries, p_max)
            AS e(id, attempts, error, retry, max)
        WHERE r.id = e.id AND r.part = p_part AND r.attempts = e.attempts
          AND (r.state IS NULL OR r.state = 'waiting');
    END IF;
    IF cardinality(p_held) > 0 THEN
        UPDATE idem_outbox AS r SET state = 'waiting', available_at = v_now
        WHERE r.id = ANY (p_held) AND r.part = p_part AND r.state IS NULL;
    END IF;
    IF cardinality(p_sent) > 0 THEN
        UPDATE idem_outbox AS r SET state = 'sent', sent_at = v_now
        WHERE r.id = ANY (p_sent) AND r.part = p_part AND r.state = 'waiting';
    END IF;
    RETURN QUERY SELECT p_part, v_until, v_key, v_pos;
END
$$;

-- Each partition's holder, cursor, pending log (walked from the cursor,
-- bounded as a read is), retry lane and the oldest of each, by the server's
-- clock: PostgresOutbox's stats. A function only to turn JIT off: the
-- planner's guess of the pending log grows with the table, and past a
-- threshold it compiles the statement, which costs a large table hundreds
-- of milliseconds at every call.
CREATE OR REPLACE FUNCTION idem_outbox_stats()
RETURNS TABLE (
    o_part           integer,
    o_owner          uuid,
    o_lease_until    bigint,
    o_cursor_key     bigint,
    o_cursor_pos     bigint,
    o_now            bigint,
    o_logged         bigint,
    o_logged_oldest  bigint,
    o_waiting        bigint,
    o_waiting_oldest bigint,
    o_parked         bigint
)
LANGUAGE sql VOLATILE
SET jit = off
AS $$
    WITH c AS MATERIALIZED (SELECT idem_outbox_now() AS now)
    SELECT p.part, p.owner, p.lease_until, p.cursor_key, p.cursor_pos, c.now,
           l.pending, l.oldest, w.waiting, w.oldest, w.parked
    FROM idem_outbox_partitions AS p CROSS JOIN c
    CROSS JOIN LATERAL (
        SELECT count(*) AS pending, min(r.enqueued_at) AS oldest
        FROM idem_outbox AS r
        WHERE r.state IS NULL AND r.part <= p.part
          AND (r.part, r.okey, r.pos) > (p.part, p.cursor_key, p.cursor_pos)
    ) AS l
    CROSS JOIN LATERAL (
        SELECT count(*) FILTER (WHERE r.state = 'waiting') AS waiting,
               min(r.enqueued_at) FILTER (WHERE r.state = 'waiting') AS oldest,
               count(*) FILTER (WHERE r.state = 'parked') AS parked
        FROM idem_outbox AS r
        WHERE r.part = p.part AND r.state IN ('waiting', 'parked')
    ) AS w
    ORDER BY p.part
$$;

-- Sets the partition count: rows 0 to p_count - 1. A count can change only
-- while nothing waits to be published (an aggregate would move partitions
-- with messages of it unsent, and lose its order).
CREATE OR REPLACE FUNCTION idem_outbox_set_partitions(p_count integer)
RETURNS void
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
    v_have integer;
BEGIN
    IF p_count < 1 OR p_count > 1024 THEN
        RAISE EXCEPTION 'idem: an outbox has 1 to 1024 partitions, not %', p_count;
    END IF;
    SELECT count(*) INTO v_have FROM idem_outbox_partitions;
    IF v_have = p_count THEN
        RETURN;
    END IF;
    IF EXISTS (
        SELECT 1 FROM idem_outbox AS r
        LEFT JOIN idem_outbox_partitions AS p ON p.part = r.part
        WHERE r.state IN ('waiting', 'parked')
           OR (r.state IS NULL AND (p.part IS NULL OR (r.okey, r.pos) > (p.cursor_key, p.cursor_pos)))
    ) THEN
        RAISE EXCEPTION 'idem: the outbox has % partitions and unsent messages; it can have % only once they are sent',
            v_have, p_count;
    END IF;
    -- What was sent through a partition that goes is sent for good, aged
    -- from its enqueue, so a purge still finds it.
    UPDATE idem_outbox AS r SET state = 'sent', sent_at = r.enqueued_at
    WHERE r.part >= p_count AND r.state IS NULL;
    DELETE FROM idem_outbox_partitions WHERE part >= p_count;
    INSERT INTO idem_outbox_partitions (part)
    SELECT generate_series(0, p_count - 1)
    ON CONFLICT (part) DO NOTHING;
END
$$;

-- Enqueues a message in the log of its aggregate's partition (p_hash modulo
-- the partition count) with its aggregate's next sequence, unless its id is
-- stored already; returns the stored row either way, and notifies the
-- table's channel when it stored one (delivered when the transaction
-- commits).
--
-- The counter row's upsert holds its lock until the caller's transaction
-- ends: the ordering described above. An id that a racing transaction stored
-- first (seen by the INSERT after that transaction committed) gives its
-- sequence back, under the lock this transaction still holds, so sequences
-- keep no gaps.
CREATE OR REPLACE FUNCTION idem_outbox_enqueue(
    p_id            uuid,
    p_aggregate     text,
    p_hash          bigint,
    p_kind          text,
    p_header_names  text[],
    p_header_values text[],
    p_payload       bytea
)
RETURNS SETOF idem_outbox
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
    v_xid      bigint := (pg_current_xact_id()::text)::bigint;
    v_sequence bigint;
    v_key      bigint;
    v_count    bigint;
    v_now      bigint;
    v_row      idem_outbox%ROWTYPE;
BEGIN
    SELECT * INTO v_row FROM idem_outbox AS r WHERE r.id = p_id;
    IF FOUND THEN
        RETURN NEXT v_row;
        RETURN;
    END IF;
    SELECT count(*) INTO v_count FROM idem_outbox_partitions;
    IF v_count = 0 THEN
        RAISE EXCEPTION 'idem: the outbox has no partitions'
            USING HINT = 'Run its migration (PostgresOutbox::migrate), which sets them.';
    END IF;
    INSERT INTO idem_outbox_aggregates AS a (aggregate, last_sequence, last_key)
    VALUES (p_aggregate, 1, v_xid)
    ON CONFLICT (aggregate) DO UPDATE
        SET last_sequence = a.last_sequence + 1, last_key = greatest(a.last_key, v_xid)
    RETURNING a.last_sequence, a.last_key INTO v_sequence, v_key;
    -- After the lock: within an aggregate, enqueue times and places follow
    -- sequences.
    v_now := idem_outbox_now();
    INSERT INTO idem_outbox AS r
        (okey, part, id, aggregate, sequence, kind, header_names, header_values, payload,
         enqueued_at, available_at)
    VALUES (v_key, mod(p_hash, v_count), p_id, p_aggregate, v_sequence, p_kind, p_header_names,
            p_header_values, p_payload, v_now, v_now)
    ON CONFLICT (id) DO NOTHING
    RETURNING * INTO v_row;
    IF FOUND THEN
        PERFORM pg_notify('idem_outbox', '');
        RETURN NEXT v_row;
        RETURN;
    END IF;
    UPDATE idem_outbox_aggregates AS a SET last_sequence = a.last_sequence - 1
    WHERE a.aggregate = p_aggregate;
    SELECT * INTO v_row FROM idem_outbox AS r WHERE r.id = p_id;
    IF FOUND THEN
        RETURN NEXT v_row;
        RETURN;
    END IF;
    RAISE EXCEPTION 'idem: outbox message % vanished while enqueued again', p_id
        USING ERRCODE = '40001';
END
$$;

-- The partition count of the store's options (PostgresOutboxOptions).
SELECT idem_outbox_set_partitions(1);
