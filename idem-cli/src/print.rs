//! What a command prints: JSON with `--json`, otherwise a table or a
//! list of fields a person reads.

use serde::Serialize;
use serde_json::Value;

/// The columns a listing shows, by the JSON fields of its items.
pub(crate) type Columns = &'static [&'static str];

/// A value's text in a cell: strings as they are, nothing for null.
fn cell(value: &Value) -> String {
    match value {
        Value::Null => String::new(),
        Value::String(text) => text.clone(),
        Value::Object(object) if object.contains_key("data") => cell(&object["data"]),
        other => other.to_string(),
    }
    .replace(['\n', '\r', '\t'], " ")
}

/// `value` as pretty JSON, or, for a person, as `render` lays it out.
pub(crate) fn print<T: Serialize>(json: bool, value: &T, render: impl FnOnce(&Value) -> String) {
    let value = serde_json::to_value(value).unwrap_or(Value::Null);
    if json {
        println!(
            "{}",
            serde_json::to_string_pretty(&value).unwrap_or_default()
        );
    } else {
        print!("{}", render(&value));
    }
}

/// Rows of `items` under `columns`, aligned.
pub(crate) fn table(items: &[Value], columns: Columns) -> String {
    let rows: Vec<Vec<String>> = items
        .iter()
        .map(|item| columns.iter().map(|c| cell(&item[*c])).collect())
        .collect();
    let widths: Vec<usize> = columns
        .iter()
        .enumerate()
        .map(|(i, c)| {
            rows.iter()
                .map(|r| r[i].chars().count())
                .max()
                .unwrap_or(0)
                .max(c.len())
        })
        .collect();
    let line = |cells: Vec<String>| {
        let padded: Vec<String> = cells
            .iter()
            .zip(&widths)
            .map(|(text, width)| format!("{text:width$}"))
            .collect();
        format!("{}\n", padded.join("  ").trim_end())
    };
    let mut out = line(columns.iter().map(|c| c.to_uppercase()).collect());
    for row in rows {
        out.push_str(&line(row));
    }
    out
}

/// A page of a listing: its table and where it stands.
pub(crate) fn listing(value: &Value, columns: Columns) -> String {
    let items = value["items"].as_array().cloned().unwrap_or_default();
    let mut out = table(&items, columns);
    out.push_str(&format!(
        "{} of {} from {}{}\n",
        items.len(),
        value["total"],
        value["offset"],
        match value["next_offset"].as_u64() {
            Some(next) => format!("; next page: --offset {next}"),
            None => String::new(),
        }
    ));
    out
}

/// One object's fields, one a line.
pub(crate) fn fields(value: &Value) -> String {
    let Some(object) = value.as_object() else {
        return format!("{}\n", cell(value));
    };
    let width = object.keys().map(String::len).max().unwrap_or(0);
    object
        .iter()
        .map(|(name, value)| {
            let text = match value {
                Value::Object(_) | Value::Array(_) if value.get("data").is_none() => {
                    value.to_string()
                }
                other => cell(other),
            };
            format!("{name:width$}  {text}\n")
        })
        .collect()
}

/// What an action did, in a line (and its detail).
pub(crate) fn done(value: &Value) -> String {
    let action = cell(&value["action"]);
    let state = cell(&value["state"]);
    let mut out = if value["changed"] == Value::Bool(true) {
        format!("{action}: done, now {state}\n")
    } else {
        format!("{action}: nothing changed, it was done before: {state}\n")
    };
    if let Some(detail) = value["detail"].as_str() {
        out.push_str(&format!("  {detail}\n"));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_table_aligns_its_columns_and_flattens_lines() {
        let items = [
            serde_json::json!({"id": "a", "reason": "two\nlines"}),
            serde_json::json!({"id": "longer", "reason": null}),
        ];
        let out = table(&items, &["id", "reason"]);
        assert_eq!(out, "ID      REASON\na       two lines\nlonger\n");
    }
}
