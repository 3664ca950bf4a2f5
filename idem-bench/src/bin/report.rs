//! `idem-bench-report RESULTS.jsonl OUT_DIR [FONT.ttf]`: turns the JSON lines
//! of a benchmark matrix into `OUT_DIR/results.md` (every run, and the
//! library-to-raw ratios) and `OUT_DIR/ops_per_s.png` (ops/s against
//! concurrency, one panel per backend).

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

fn key(r: &RunResult) -> (String, String, usize) {
    (r.backend.clone(), r.workload.clone(), r.concurrency)
}

fn markdown(results: &[RunResult]) -> String {
    let mut lib = BTreeMap::new();
    let mut raw = BTreeMap::new();
    for r in results {
        let side = if r.mode == "raw" { &mut raw } else { &mut lib };
        side.insert(key(r), r);
    }
    let mut out = String::from(
        "# idem benchmarks\n\n\
         One operation is one request through idem: a fresh one is a claim and a completion, \
         a replay one claim. `lib/raw` is idem's ops/s over the same server operations sent \
         with the driver alone. Round trips are counted by the server.\n\n\
         | backend | workload | conc | lib ops/s | raw ops/s | lib/raw | lib p50 µs | lib p99 µs | lib p99.9 µs | raw p50 µs | rt/op | calls/op | rt/call |\n\
         |---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n",
    );
    let mut keys: Vec<_> = lib.keys().chain(raw.keys()).cloned().collect();
    keys.sort_by_key(|(b, w, c)| {
        (
            BACKENDS.iter().position(|x| x == b),
            WORKLOADS.iter().position(|x| x == w),
            *c,
        )
    });
    keys.dedup();
    for k in keys {
        let (l, r) = (lib.get(&k), raw.get(&k));
        let num = |v: Option<f64>, digits: usize| {
            v.map_or("–".to_string(), |v| format!("{v:.digits$}"))
        };
        let ratio = match (l, r) {
            (Some(l), Some(r)) if r.ops_per_s > 0.0 => Some(l.ops_per_s / r.ops_per_s),
            _ => None,
        };
        let any = l.or(r).copied();
        let rt_per_call = any.and_then(|x| {
            (x.store_calls_per_op > 0.0 && x.backend != "memory")
                .then(|| x.round_trips_per_op / x.store_calls_per_op)
        });
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
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
        );
    }
    out
}

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
