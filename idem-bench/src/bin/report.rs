//! `idem-bench-report RESULTS.jsonl OUT_DIR [FONT.ttf]`: turns the JSON lines
//! of a benchmark matrix into `OUT_DIR/results.md` (every run, the
//! library-to-raw ratios, errors and the outcome mix; then the runs through
//! the replay cache beside the same runs without it) and
//! `OUT_DIR/ops_per_s.png` (ops/s against concurrency, one panel per backend).

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;

use idem_bench::RunResult;
use plotters::prelude::*;
use plotters::style::{FontStyle, register_font};

type Error = Box<dyn std::error::Error>;

const BACKENDS: [&str; 5] = ["memory", "postgres", "redis", "redis-cluster", "dynamo"];
const WORKLOADS: [&str; 4] = ["fresh", "replay", "contended", "mixed"];
const DEFAULT_FONT: &str = "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf";

/// A row's identity: backend, workload, concurrency.
fn key(r: &RunResult) -> (String, String, usize) {
    (r.backend.clone(), r.workload.clone(), r.concurrency)
}

/// A share in whole percent (halves rounded up); a share that rounds to 0
/// or 100 without being it shows as `<1` or `>99`, so a rare outcome stays
/// visible.
fn percent(share: f64) -> String {
    let whole = share.round();
    if whole == 0.0 && share > 0.0 {
        "<1".to_string()
    } else if whole == 100.0 && share < 100.0 {
        ">99".to_string()
    } else {
        format!("{whole:.0}")
    }
}

/// The outcome mix as `executed/replayed/409/422` percentages, or `–`
/// without a run or without a recorded mix (results of older versions).
fn mix_cell(run: Option<&RunResult>) -> String {
    match run.and_then(|r| r.mix().percentages()) {
        Some(shares) => shares.map(percent).join("/"),
        None => "–".to_string(),
    }
}

/// The rows of one mode, by backend, workload and concurrency.
type Runs<'a> = BTreeMap<(String, String, usize), &'a RunResult>;

/// `keys` in the report's order: backends, workloads, then concurrency.
fn ordered(mut keys: Vec<(String, String, usize)>) -> Vec<(String, String, usize)> {
    keys.sort_by_key(|(b, w, c)| {
        (
            BACKENDS.iter().position(|x| x == b),
            WORKLOADS.iter().position(|x| x == w),
            *c,
        )
    });
    keys.dedup();
    keys
}

/// A number with `digits` decimals, or `–` without one.
fn num(v: Option<f64>, digits: usize) -> String {
    v.map_or("–".to_string(), |v| format!("{v:.digits$}"))
}

/// The markdown report: one row per backend, workload and concurrency,
/// idem beside raw; then, where runs went through the replay cache, each
/// beside the same run without it.
fn markdown(results: &[RunResult]) -> String {
    let (mut lib, mut raw, mut cache) = (Runs::new(), Runs::new(), Runs::new());
    for r in results {
        let side = match r.mode.as_str() {
            "raw" => &mut raw,
            "cache" => &mut cache,
            _ => &mut lib,
        };
        side.insert(key(r), r);
    }
    let mut out = String::from(
        "# idem benchmarks\n\n\
         One operation is one request through idem: a fresh one is a claim and a completion, \
         a replay one claim. `lib/raw` is idem's ops/s over the same server operations sent \
         with the driver alone. Round trips are counted by the server. `errors` counts \
         operations that failed (lib/raw), outside the ops; the mix is each run's share of \
         operations executed, replayed, refused in progress (409) and refused as a \
         mismatch (422), in percent.\n\n\
         | backend | workload | conc | lib ops/s | raw ops/s | lib/raw | lib p50 µs | lib p99 µs | lib p99.9 µs | raw p50 µs | rt/op | calls/op | rt/call | errors lib/raw | lib exec/replay/409/422 % | raw exec/replay/409/422 % |\n\
         |---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n",
    );
    for k in ordered(lib.keys().chain(raw.keys()).cloned().collect()) {
        let (l, r) = (lib.get(&k), raw.get(&k));
        let ratio = match (l, r) {
            (Some(l), Some(r)) if r.ops_per_s > 0.0 => Some(l.ops_per_s / r.ops_per_s),
            _ => None,
        };
        let any = l.or(r).copied();
        let rt_per_call = any.and_then(|x| {
            (x.store_calls_per_op > 0.0 && x.backend != "memory")
                .then(|| x.round_trips_per_op / x.store_calls_per_op)
        });
        let errors = format!(
            "{}/{}",
            num(l.map(|x| x.errors as f64), 0),
            num(r.map(|x| x.errors as f64), 0)
        );
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
            k.0,
            k.1,
            k.2,
            num(l.map(|x| x.ops_per_s), 0),
            num(r.map(|x| x.ops_per_s), 0),
            num(ratio, 2),
            num(l.map(|x| x.p50_us as f64), 0),
            num(l.map(|x| x.p99_us as f64), 0),
            num(l.map(|x| x.p999_us as f64), 0),
            num(r.map(|x| x.p50_us as f64), 0),
            num(l.map(|x| x.round_trips_per_op), 2),
            num(l.map(|x| x.store_calls_per_op), 2),
            num(rt_per_call, 2),
            errors,
            mix_cell(l.copied()),
            mix_cell(r.copied()),
        );
    }
    if !cache.is_empty() {
        out.push_str(&cache_table(&lib, &cache));
    }
    out
}

/// The runs through the replay cache, each beside the same run without it.
fn cache_table(lib: &Runs<'_>, cache: &Runs<'_>) -> String {
    let mut out = String::from(
        "\n## The replay cache\n\n\
         The same runs through idem with the replay cache (`idem-cache`) in front of the \
         store, beside idem without it. A cached replay is answered in process; the first \
         replay of each key still reaches the server.\n\n\
         | backend | workload | conc | lib ops/s | cache ops/s | cache/lib | lib p50 µs | cache p50 µs | lib p99 µs | cache p99 µs | lib rt/op | cache rt/op | errors lib/cache |\n\
         |---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n",
    );
    for k in ordered(cache.keys().cloned().collect()) {
        let (l, c) = (lib.get(&k), cache.get(&k));
        let ratio = match (l, c) {
            (Some(l), Some(c)) if l.ops_per_s > 0.0 => Some(c.ops_per_s / l.ops_per_s),
            _ => None,
        };
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {}/{} |",
            k.0,
            k.1,
            k.2,
            num(l.map(|x| x.ops_per_s), 0),
            num(c.map(|x| x.ops_per_s), 0),
            num(ratio, 1),
            num(l.map(|x| x.p50_us as f64), 0),
            num(c.map(|x| x.p50_us as f64), 0),
            num(l.map(|x| x.p99_us as f64), 0),
            num(c.map(|x| x.p99_us as f64), 0),
            num(l.map(|x| x.round_trips_per_op), 3),
            num(c.map(|x| x.round_trips_per_op), 3),
            num(l.map(|x| x.errors as f64), 0),
            num(c.map(|x| x.errors as f64), 0),
        );
    }
    out
}

/// The ops/s chart: one panel per backend, a line per workload and mode.
fn chart(results: &[RunResult], path: &Path) -> Result<(), Error> {
    let root = BitMapBackend::new(path, (1500, 1000)).into_drawing_area();
    root.fill(&WHITE)?;
    let root = root.titled(
        "idem: ops/s against concurrency (solid: lib, dashed: raw)",
        ("sans-serif", 26),
    )?;
    let panels = root.split_evenly((2, 3));
    let colors = [RED, BLUE, GREEN, MAGENTA];
    for (panel, backend) in panels.iter().zip(BACKENDS) {
        let mine: Vec<&RunResult> = results.iter().filter(|r| r.backend == backend).collect();
        let top = mine.iter().map(|r| r.ops_per_s).fold(1.0, f64::max) * 1.5;
        let bottom = (mine.iter().map(|r| r.ops_per_s).fold(top, f64::min) / 2.0).max(1.0);
        let mut chart = ChartBuilder::on(panel)
            .caption(backend, ("sans-serif", 22))
            .margin(12)
            .x_label_area_size(36)
            .y_label_area_size(70)
            .build_cartesian_2d((0.8f64..40f64).log_scale(), (bottom..top).log_scale())?;
        chart
            .configure_mesh()
            .x_desc("concurrency")
            .y_desc("ops/s")
            .x_labels(6)
            .x_label_formatter(&|x| format!("{x:.0}"))
            .y_label_formatter(&|y| format!("{y:.0}"))
            .draw()?;
        for (workload, color) in WORKLOADS.into_iter().zip(colors) {
            for mode in ["lib", "raw"] {
                let mut points: Vec<(f64, f64)> = mine
                    .iter()
                    .filter(|r| r.workload == workload && r.mode == mode && r.ops_per_s > 0.0)
                    .map(|r| (r.concurrency as f64, r.ops_per_s))
                    .collect();
                points.sort_by(|a, b| a.0.total_cmp(&b.0));
                if points.is_empty() {
                    continue;
                }
                let style = color.stroke_width(2);
                if mode == "lib" {
                    chart
                        .draw_series(LineSeries::new(points.clone(), style))?
                        .label(workload)
                        .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], style));
                    chart.draw_series(points.iter().map(|p| Circle::new(*p, 3, color.filled())))?;
                } else {
                    chart.draw_series(DashedLineSeries::new(points, 6, 4, style))?;
                }
            }
        }
        chart
            .configure_series_labels()
            .background_style(WHITE.mix(0.8))
            .border_style(BLACK)
            .position(SeriesLabelPosition::LowerRight)
            .draw()?;
    }
    root.present()?;
    Ok(())
}

fn main() -> Result<(), Error> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (Some(input), Some(out_dir)) = (args.first(), args.get(1)) else {
        return Err("usage: idem-bench-report RESULTS.jsonl OUT_DIR [FONT.ttf]".into());
    };
    let font = args.get(2).map_or(DEFAULT_FONT, String::as_str);
    let results: Vec<RunResult> = std::fs::read_to_string(input)?
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(serde_json::from_str)
        .collect::<Result<_, _>>()?;
    std::fs::create_dir_all(out_dir)?;
    let table = markdown(&results);
    std::fs::write(Path::new(out_dir).join("results.md"), &table)?;
    // plotters draws text with ab_glyph from a font we hand it.
    let bytes: &'static [u8] = Box::leak(
        std::fs::read(font)
            .map_err(|e| {
                format!("cannot read the chart font {font}: {e} (install fonts-dejavu-core)")
            })?
            .into_boxed_slice(),
    );
    register_font("sans-serif", FontStyle::Normal, bytes)
        .map_err(|_| "the chart font is not a TrueType font")?;
    chart(&results, &Path::new(out_dir).join("ops_per_s.png"))?;
    print!("{table}");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(mode: &str, errors: u64, mix: [u64; 4]) -> RunResult {
        let [executed, replayed, in_progress, mismatch] = mix;
        RunResult {
            backend: "redis".into(),
            workload: "mixed".into(),
            mode: mode.into(),
            concurrency: 4,
            ops: mix.iter().sum(),
            ops_per_s: 1000.0,
            p50_us: 500,
            p99_us: 900,
            p999_us: 1300,
            round_trips_per_op: 1.6,
            store_calls_per_op: 1.6,
            errors,
            executed,
            replayed,
            in_progress,
            mismatch,
        }
    }

    fn row(report: &str) -> Vec<String> {
        let line = report.lines().find(|l| l.starts_with("| redis |")).unwrap();
        line.trim_matches('|')
            .split('|')
            .map(|c| c.trim().to_string())
            .collect()
    }

    #[test]
    fn a_row_shows_errors_of_both_modes_and_each_modes_outcome_mix() {
        let report = markdown(&[
            run("lib", 2, [600, 300, 0, 100]),
            run("raw", 0, [598, 300, 2, 100]),
        ]);
        let row = row(&report);
        assert_eq!(row.len(), 16, "{row:?}");
        assert_eq!(row[13], "2/0");
        assert_eq!(row[14], "60/30/0/10");
        assert_eq!(row[15], "60/30/<1/10");
    }

    #[test]
    fn the_header_names_as_many_columns_as_a_row_has() {
        let report = markdown(&[run("lib", 0, [1, 0, 0, 0])]);
        let header = report.lines().find(|l| l.starts_with("| backend")).unwrap();
        let rule = report.lines().find(|l| l.starts_with("|---")).unwrap();
        let cells = |l: &str| l.matches('|').count();
        assert_eq!(cells(header), cells(rule));
        assert_eq!(cells(header), row(&report).len() + 1);
    }

    #[test]
    fn a_missing_run_or_an_unrecorded_mix_shows_a_dash() {
        let report = markdown(&[run("lib", 0, [0; 4])]);
        let row = row(&report);
        assert_eq!(row[13], "0/–");
        assert_eq!(row[14], "–");
        assert_eq!(row[15], "–");
    }

    #[test]
    fn cached_runs_sit_beside_the_same_runs_without_the_cache_in_a_table_of_their_own() {
        let mut cached = run("cache", 0, [0, 1000, 0, 0]);
        cached.ops_per_s = 25_000.0;
        cached.p50_us = 3;
        cached.round_trips_per_op = 0.001;
        let report = markdown(&[
            run("lib", 0, [0, 1000, 0, 0]),
            run("raw", 0, [0, 1000, 0, 0]),
            cached,
        ]);
        let (main, cache) = report.split_once("## The replay cache").unwrap();
        assert_eq!(
            main.lines().filter(|l| l.starts_with("| redis |")).count(),
            1
        );
        let cells = row(cache);
        assert_eq!(cells.len(), 13, "{cells:?}");
        assert_eq!(&cells[3..6], ["1000", "25000", "25.0"]);
        assert_eq!(&cells[6..8], ["500", "3"]);
        assert_eq!(&cells[10..12], ["1.600", "0.001"]);
        let header = cache.lines().find(|l| l.starts_with("| backend")).unwrap();
        assert_eq!(header.matches('|').count(), cells.len() + 1);
    }

    #[test]
    fn without_cached_runs_there_is_no_cache_table() {
        let report = markdown(&[run("lib", 0, [1, 0, 0, 0])]);
        assert!(!report.contains("replay cache"));
    }

    #[test]
    fn shares_that_round_to_the_ends_stay_visible() {
        assert_eq!(percent(0.0), "0");
        assert_eq!(percent(0.3), "<1");
        assert_eq!(percent(0.5), "1");
        assert_eq!(percent(74.5), "75");
        assert_eq!(percent(99.7), ">99");
        assert_eq!(percent(100.0), "100");
        assert_eq!(percent(42.4), "42");
    }
}
