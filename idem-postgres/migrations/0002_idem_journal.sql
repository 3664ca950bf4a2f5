-- idem: the outbound operation journal's table and its one-round-trip
-- functions (PostgreSQL 12+), for PostgresJournal.
--
-- Every statement is idempotent. Run this file as it is for the default table
-- name `idem_journal`, or take PostgresJournal::migration_sql(), which is this
-- text with the table name replaced, for another name.
--
-- Every time is a bigint of whole milliseconds since the Unix epoch, by the
-- server's clock_timestamp() (now() is frozen at the start of a transaction,
-- and record_in may run late inside a caller's long one). A bigint keeps any
-- time a caller hands over (a search deadline) exactly, where a timestamptz
-- would refuse the far ones.

CREATE TABLE IF NOT EXISTS idem_journal (
    namespace     text   NOT NULL,
    subject       text   NOT NULL,
    effect        text   NOT NULL,
    -- The caller's JSON as serialized, read back exactly: jsonb would rewrite
    -- numbers and refuse \u0000. Operators can still query `request::jsonb`.
    request       text   NOT NULL,
    provider_key  text   NOT NULL,
    -- OperationState::as_str; unchecked here, so a state a later version
    -- adds needs no migration (a name no version writes reads as corrupt).
    state         text   NOT NULL,
    provider_id   text,
    detail        text,
    first_sent_at bigint,
    sends         bigint NOT NULL CHECK (sends BETWEEN 0 AND 4294967295),
    created_at    bigint NOT NULL,
    updated_at    bigint NOT NULL,
    lease_owner   uuid,
    lease_until   bigint,
    search_until  bigint,
    PRIMARY KEY (namespace, subject, effect)
);

-- list walks this index: one namespace, the states asked for, oldest change first.
CREATE INDEX IF NOT EXISTS idem_journal_list_idx ON idem_journal (namespace, state, updated_at);

-- The server's clock in whole milliseconds: the one clock of every lease,
-- send and change.
CREATE OR REPLACE FUNCTION idem_journal_now()
RETURNS bigint
LANGUAGE sql VOLATILE
AS $$
    SELECT (extract(epoch FROM date_trunc('milliseconds', clock_timestamp())) * 1000)::bigint
$$;

-- Records an operation unless its key exists; returns the stored row.
--
-- INSERT ... ON CONFLICT DO NOTHING writes nothing when the row exists. Each
-- statement of a volatile PL/pgSQL function takes a fresh snapshot, so the
-- SELECT after the INSERT sees a row that a racing record committed while the
-- INSERT waited for it (a single-statement CTE would not).
CREATE OR REPLACE FUNCTION idem_journal_record(
    p_namespace    text,
    p_subject      text,
    p_effect       text,
    p_request      text,
    p_provider_key text
)
RETURNS SETOF idem_journal
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
    v_now bigint;
    v_row idem_journal%ROWTYPE;
BEGIN
    FOR lap IN 1..8 LOOP
        v_now := idem_journal_now();
        INSERT INTO idem_journal AS r
            (namespace, subject, effect, request, provider_key, state, sends, created_at, updated_at)
        VALUES (p_namespace, p_subject, p_effect, p_request, p_provider_key, 'pending', 0, v_now, v_now)
        ON CONFLICT (namespace, subject, effect) DO NOTHING
        RETURNING * INTO v_row;
        IF FOUND THEN
            RETURN NEXT v_row;
            RETURN;
        END IF;
        SELECT * INTO v_row FROM idem_journal AS r
        WHERE r.namespace = p_namespace AND r.subject = p_subject AND r.effect = p_effect;
        IF FOUND THEN
            RETURN NEXT v_row;
            RETURN;
        END IF;
        -- Deleted (by hand) since the INSERT met it: insert again.
    END LOOP;
    RAISE EXCEPTION 'idem: journal record did not settle after 8 laps' USING ERRCODE = '40001';
END
$$;

-- Leases an open operation to p_owner for p_lease_ms from the server's now.
--
-- Outcomes: 'absent' (no row), 'settled', 'busy' (another owner's lease
-- lives), 'held' (the row as leased). The answers that write nothing take no
-- lock. The UPDATE re-checks its guard on the latest row version, so of racing
-- acquisitions exactly one wins and the others read the winner on the next lap.
CREATE OR REPLACE FUNCTION idem_journal_acquire(
    p_namespace text,
    p_subject   text,
    p_effect    text,
    p_owner     uuid,
    p_lease_ms  bigint
)
RETURNS TABLE (o_outcome text, o_now bigint, o_record idem_journal)
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
    v_now bigint;
    v_row idem_journal%ROWTYPE;
BEGIN
    FOR lap IN 1..8 LOOP
        v_now := idem_journal_now();
        o_now := v_now;
        SELECT * INTO v_row FROM idem_journal AS r
        WHERE r.namespace = p_namespace AND r.subject = p_subject AND r.effect = p_effect;
        IF NOT FOUND THEN
            o_outcome := 'absent';
            o_record := NULL;
            RETURN NEXT;
            RETURN;
        END IF;
        IF v_row.state IN ('succeeded', 'failed') THEN
            o_outcome := 'settled';
            o_record := v_row;
            RETURN NEXT;
            RETURN;
        END IF;
        IF v_row.lease_owner <> p_owner AND v_row.lease_until > v_now THEN
            o_outcome := 'busy';
            o_record := v_row;
            RETURN NEXT;
            RETURN;
        END IF;
        -- Free, lapsed, or this owner's own (a second delivery): lease it,
        -- unless another acquisition or a finish got there first.
        UPDATE idem_journal AS r
        SET lease_owner = p_owner, lease_until = v_now + p_lease_ms,
            updated_at = greatest(r.updated_at, v_now)
        WHERE r.namespace = p_namespace AND r.subject = p_subject AND r.effect = p_effect
          AND r.state NOT IN ('succeeded', 'failed')
          AND (r.lease_owner IS NULL OR r.lease_owner = p_owner
               OR r.lease_until IS NULL OR r.lease_until <= v_now)
        RETURNING * INTO v_row;
        IF FOUND THEN
            o_outcome := 'held';
            o_record := v_row;
            RETURN NEXT;
            RETURN;
        END IF;
    END LOOP;
    RAISE EXCEPTION 'idem: journal acquire did not settle after 8 laps' USING ERRCODE = '40001';
END
$$;

-- Counts one send after p_sends under p_owner's live lease; the first starts
-- the provider's key window. Returns the row, or no row for a lost lease.
--
-- Delivered twice, the second finds the send counted (sends = p_sends + 1,
-- still under the lease) and answers as the first did, writing nothing.
CREATE OR REPLACE FUNCTION idem_journal_mark_sent(
    p_namespace text,
    p_subject   text,
    p_effect    text,
    p_owner     uuid,
    p_sends     bigint
)
RETURNS SETOF idem_journal
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
    v_now   bigint;
    -- Saturating, as the count is a u32.
    v_after bigint := least(p_sends + 1, 4294967295);
    v_row   idem_journal%ROWTYPE;
BEGIN
    FOR lap IN 1..8 LOOP
        v_now := idem_journal_now();
        UPDATE idem_journal AS r
        SET sends = v_after, first_sent_at = coalesce(r.first_sent_at, v_now),
            updated_at = greatest(r.updated_at, v_now)
        WHERE r.namespace = p_namespace AND r.subject = p_subject AND r.effect = p_effect
          AND r.lease_owner = p_owner AND r.lease_until > v_now
          AND r.state NOT IN ('succeeded', 'failed') AND r.sends = p_sends
        RETURNING * INTO v_row;
        IF FOUND THEN
            RETURN NEXT v_row;
            RETURN;
        END IF;
        SELECT * INTO v_row FROM idem_journal AS r
        WHERE r.namespace = p_namespace AND r.subject = p_subject AND r.effect = p_effect;
        IF NOT FOUND OR v_row.lease_owner IS DISTINCT FROM p_owner OR v_row.lease_until IS NULL
           OR v_row.lease_until <= v_now OR v_row.state IN ('succeeded', 'failed') THEN
            RETURN;
        END IF;
        IF v_row.sends = v_after THEN
            RETURN NEXT v_row;
            RETURN;
        END IF;
        IF v_row.sends <> p_sends THEN
            RETURN;
        END IF;
        -- Countable now, yet the UPDATE's snapshot saw it otherwise (a lease
        -- moved under it): count again.
    END LOOP;
    RAISE EXCEPTION 'idem: journal mark_sent did not settle after 8 laps' USING ERRCODE = '40001';
END
$$;

-- Writes a finish under p_owner's live lease and releases the lease: the
-- state, the provider's id (NULL keeps the stored one), the detail and the
-- search deadline. Returns the row, or no row for a lost lease.
--
-- Delivered twice, the second finds what the first left (released, last held
-- by p_owner, the same state, detail, deadline and id) and answers with it.
CREATE OR REPLACE FUNCTION idem_journal_finish(
    p_namespace    text,
    p_subject      text,
    p_effect       text,
    p_owner        uuid,
    p_state        text,
    p_provider_id  text,
    p_detail       text,
    p_search_until bigint
)
RETURNS SETOF idem_journal
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
    v_now bigint;
    v_row idem_journal%ROWTYPE;
BEGIN
    FOR lap IN 1..8 LOOP
        v_now := idem_journal_now();
        UPDATE idem_journal AS r
        SET state = p_state, provider_id = coalesce(p_provider_id, r.provider_id),
            detail = p_detail, search_until = p_search_until, lease_until = NULL,
            updated_at = greatest(r.updated_at, v_now)
        WHERE r.namespace = p_namespace AND r.subject = p_subject AND r.effect = p_effect
          AND r.lease_owner = p_owner AND r.lease_until > v_now
          AND r.state NOT IN ('succeeded', 'failed')
        RETURNING * INTO v_row;
        IF FOUND THEN
            RETURN NEXT v_row;
            RETURN;
        END IF;
        SELECT * INTO v_row FROM idem_journal AS r
        WHERE r.namespace = p_namespace AND r.subject = p_subject AND r.effect = p_effect;
        IF NOT FOUND THEN
            RETURN;
        END IF;
        IF v_row.lease_owner = p_owner AND v_row.lease_until IS NULL AND v_row.state = p_state
           AND v_row.detail IS NOT DISTINCT FROM p_detail
           AND v_row.search_until IS NOT DISTINCT FROM p_search_until
           AND (p_provider_id IS NULL OR v_row.provider_id = p_provider_id) THEN
            RETURN NEXT v_row;
            RETURN;
        END IF;
        IF v_row.lease_owner IS DISTINCT FROM p_owner OR v_row.lease_until IS NULL
           OR v_row.lease_until <= v_now OR v_row.state IN ('succeeded', 'failed') THEN
            RETURN;
        END IF;
        -- Held by p_owner, yet the UPDATE's snapshot saw it otherwise: again.
    END LOOP;
    RAISE EXCEPTION 'idem: journal finish did not settle after 8 laps' USING ERRCODE = '40001';
END
$$;
