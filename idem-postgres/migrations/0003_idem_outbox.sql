-- idem: the transactional outbox's tables and its enqueue function
-- (PostgreSQL 12+), for PostgresOutbox.
--
-- Every statement is idempotent. Run this file as it is for the default table
-- name `idem_outbox`, or take PostgresOutbox::migration_sql(), which is this
-- text with the table name (and the notification channel) replaced, for
-- another name.
--
-- Every time is a bigint of whole milliseconds since the Unix epoch, by the
-- server's clock_timestamp() (now() is frozen at the start of a transaction,
-- and an enqueue may run late inside a caller's long one).
--
-- Ordering. Each aggregate has a counter row in idem_outbox_aggregates; an
-- enqueue takes the next sequence by updating that row, and so holds its lock
-- until the enqueuing transaction ends. A second transaction enqueueing for
-- the same aggregate waits for the first to commit (or roll back) and then
-- takes the next number: sequences follow the commit order, and a message
-- that has not committed yet is always the highest of its aggregate. The
-- relay claims each aggregate's head (its lowest sequence not sent or
-- dropped), so a message that commits late is never skipped: it becomes the
-- head in its turn.

CREATE TABLE IF NOT EXISTS idem_outbox (
    id            uuid   PRIMARY KEY,
    aggregate     text   NOT NULL,
    sequence      bigint NOT NULL CHECK (sequence >= 1),
    kind          text   NOT NULL,
    header_names  text[] NOT NULL,
    header_values text[] NOT NULL,
    payload       bytea  NOT NULL,
    -- MessageState::as_str; unchecked here, so a state a later version adds
    -- needs no migration (a name no version writes reads as corrupt).
    state         text   NOT NULL,
    attempts      bigint NOT NULL CHECK (attempts BETWEEN 0 AND 4294967295),
    last_error    text,
    enqueued_at   bigint NOT NULL,
    available_at  bigint NOT NULL,
    lease_owner   uuid,
    lease_until   bigint,
    sent_at       bigint,
    UNIQUE (aggregate, sequence)
) WITH (fillfactor = 70);

-- Room on each page, so a claim's lease (no indexed column) is a HOT update
-- on the message's own page: no new index entries. Set again for a table an
-- earlier version created.
ALTER TABLE idem_outbox SET (fillfactor = 70);

-- The last sequence of each aggregate: the row an enqueue locks. Kept after
-- a purge, so an aggregate's sequences never start again.
CREATE TABLE IF NOT EXISTS idem_outbox_aggregates (
    aggregate     text   PRIMARY KEY,
    last_sequence bigint NOT NULL
);

-- Whether an aggregate has an open message below a candidate head.
CREATE INDEX IF NOT EXISTS idem_outbox_open_idx ON idem_outbox (aggregate, sequence)
    WHERE state IN ('pending', 'parked');

-- A claim walks the pending messages oldest first; parked lists the parked
-- ones. Two indexes, not one over both states: the claim's test of an open
-- message below a head (state pending or parked) must find no index but
-- the open one above to match it, whatever the statistics say.
CREATE INDEX IF NOT EXISTS idem_outbox_pending_idx ON idem_outbox (enqueued_at, id)
    WHERE state = 'pending';
CREATE INDEX IF NOT EXISTS idem_outbox_parked_idx ON idem_outbox (enqueued_at, id)
    WHERE state = 'parked';
-- Both states in one index, as an earlier version had it.
DROP INDEX IF EXISTS idem_outbox_waiting_idx;

-- A purge finds finished messages by when they finished: sent_at, the send
-- or the drop (a message an earlier version dropped keeps no sent_at, and
-- counts from its enqueue).
CREATE INDEX IF NOT EXISTS idem_outbox_finished_idx ON idem_outbox ((coalesce(sent_at, enqueued_at)))
    WHERE state IN ('sent', 'dropped');

-- The server's clock in whole milliseconds: the one clock of every lease,
-- back-off and age.
CREATE OR REPLACE FUNCTION idem_outbox_now()
RETURNS bigint
LANGUAGE sql VOLATILE
AS $$
    SELECT (extract(epoch FROM date_trunc('milliseconds', clock_timestamp())) * 1000)::bigint
$$;

-- Enqueues a message pending with its aggregate's next sequence, unless its
-- id is stored already; returns the stored row either way, and notifies the
-- table's channel when it stored one (delivered when the transaction commits).
--
-- The counter row's upsert holds its lock until the caller's transaction
-- ends: the ordering described above. An id that a racing transaction stored
-- first (seen by the INSERT after that transaction committed) gives its
-- sequence back, under the lock this transaction still holds, so sequences
-- keep no gaps.
CREATE OR REPLACE FUNCTION idem_outbox_enqueue(
    p_id            uuid,
    p_aggregate     text,
    p_kind          text,
    p_header_names  text[],
    p_header_values text[],
    p_payload       bytea
)
RETURNS SETOF idem_outbox
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
    v_sequence bigint;
    v_now      bigint;
    v_row      idem_outbox%ROWTYPE;
BEGIN
    SELECT * INTO v_row FROM idem_outbox AS r WHERE r.id = p_id;
    IF FOUND THEN
        RETURN NEXT v_row;
        RETURN;
    END IF;
    INSERT INTO idem_outbox_aggregates AS a (aggregate, last_sequence)
    VALUES (p_aggregate, 1)
    ON CONFLICT (aggregate) DO UPDATE SET last_sequence = a.last_sequence + 1
    RETURNING a.last_sequence INTO v_sequence;
    -- After the lock: within an aggregate, enqueue times follow sequences.
    v_now := idem_outbox_now();
    INSERT INTO idem_outbox AS r
        (id, aggregate, sequence, kind, header_names, header_values, payload, state, attempts,
         enqueued_at, available_at)
    VALUES (p_id, p_aggregate, v_sequence, p_kind, p_header_names, p_header_values, p_payload,
            'pending', 0, v_now, v_now)
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

-- Claims up to p_limit aggregate heads for p_owner, leased for p_lease
-- milliseconds, and the next message of each aggregate p_owner holds;
-- returns them (in no order).
--
-- The candidates: pending, free, available, with no open message of their
-- aggregate below them but those p_owner holds (a parked message is always
-- its aggregate's head, and only a head or the message after its owner's
-- run from the head is ever leased, so this also says nothing below is
-- parked or leased to another owner). A message claimed past the owner's
-- run takes the earliest lease of that run: an aggregate's leases lapse
-- together, and a relay taking over finds the whole aggregate free.
--
-- The walk goes oldest first down the pending index and stops at the
-- limit; each candidate's test is a probe of the open index by its
-- aggregate and sequence, which stops at the first message the owner does
-- not hold (the head, unless the owner holds it). Statistics taken before
-- a backlog built up (or none yet, on a new table) would plan otherwise:
-- the backlog read whole and sorted, or the open index read whole for each
-- candidate, on every claim, and most when the backlog is biggest. So
-- sorting is ruled out (the index's order is the plan), and the test is
-- kept a subquery of its own (OFFSET 0: never flattened into a join whose
-- inner side may be a whole scan), planned with the candidate's aggregate
-- and sequence as its index's bounds.
-- `FOR UPDATE OF o SKIP LOCKED` locks each candidate before the limit
-- counts it, passing over those a racing claim holds, and re-checks it on
-- its latest version: one a racing claim leased, or a relay sent, since
-- this statement's snapshot drops out. What lies below a candidate changes
-- for good (sent and dropped are final; a new message takes a higher
-- sequence) or by its owner's own doing (a failure or a release of a
-- message it holds, after which its relay publishes nothing it claimed
-- above that message and hands it back), so a claim racing its owner's
-- failure at worst leases a message that relay will not publish.
-- The update finds the picked rows by their key (an array, not a join the
-- planner may hash over the whole table, sent rows included), and reads
-- each one's inherited lease with one more probe.
CREATE OR REPLACE FUNCTION idem_outbox_claim(p_owner uuid, p_lease bigint, p_limit bigint)
RETURNS SETOF idem_outbox
LANGUAGE plpgsql VOLATILE
SET enable_sort = off
AS $$
BEGIN
    RETURN QUERY
    WITH c AS MATERIALIZED (SELECT idem_outbox_now() AS now),
    picked AS (
        SELECT o.id FROM idem_outbox AS o CROSS JOIN c
        WHERE o.state = 'pending' AND o.available_at <= c.now
          AND (o.lease_until IS NULL OR o.lease_until <= c.now)
          AND NOT EXISTS (
            SELECT 1 FROM idem_outbox AS p
            WHERE p.aggregate = o.aggregate AND p.sequence < o.sequence
              AND p.state IN ('pending', 'parked')
              AND NOT coalesce(p.state = 'pending' AND p.lease_owner = p_owner
                               AND p.lease_until > c.now, false)
            OFFSET 0)
        ORDER BY o.enqueued_at, o.id
        LIMIT p_limit
        FOR UPDATE OF o SKIP LOCKED
    )
    UPDATE idem_outbox AS r SET lease_owner = p_owner,
        lease_until = coalesce((
            SELECT min(p.lease_until) FROM idem_outbox AS p
            WHERE p.aggregate = r.aggregate AND p.sequence < r.sequence
              AND p.state IN ('pending', 'parked')
              AND p.lease_owner = p_owner AND p.lease_until > c.now), c.now + p_lease)
    FROM c WHERE r.id = ANY(ARRAY(SELECT id FROM picked))
    RETURNING r.*;
END
$$;
