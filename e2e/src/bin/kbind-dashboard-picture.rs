//! Renders kbind's Grafana dashboard (`deploy/charts/kbind/dashboards/kbind.json`) as one HTML page
//! of SVG charts, every panel's queries evaluated by a real Prometheus over a time range — the
//! picture `scripts/dashboard-picture` takes of a benchmark run (Grafana itself is not packaged
//! for this machine; the layout, titles, queries, legends and units are the dashboard's own).
//! Prints the page's height in pixels.

use std::fmt::Write as _;
use std::path::PathBuf;

use clap::Parser;
use serde_json::Value;

#[derive(Parser)]
#[command(name = "kbind-dashboard-picture")]
struct Args {
    /// `host:port` of the Prometheus HTTP API.
    #[arg(long)]
    prometheus: String,
    /// The dashboard JSON.
    #[arg(long)]
    dashboard: PathBuf,
    /// Range start and end, Unix seconds.
    #[arg(long)]
    start: f64,
    #[arg(long)]
    end: f64,
    /// Seconds between points.
    #[arg(long, default_value_t = 2.0)]
    step: f64,
    /// What `$__rate_interval` stands for.
    #[arg(long, default_value = "10s")]
    rate_interval: String,
    /// A line under the title (what fed the dashboard).
    #[arg(long, default_value = "")]
    subtitle: String,
    /// The HTML page to write.
    #[arg(long)]
    out: PathBuf,
}

const WIDTH: f64 = 1600.0;
const MARGIN: f64 = 8.0;
const ROW_UNIT: f64 = 30.0;
const HEADER: f64 = 64.0;
const PALETTE: [&str; 8] = [
    "#73bf69", "#f2cc0c", "#8ab8ff", "#ff780a", "#f2495c", "#5794f2", "#b877d9", "#83d0c7",
];

/// One series of a query's answer.
struct Series {
    label: String,
    points: Vec<(f64, f64)>,
}

fn encode(text: &str) -> String {
    text.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// `{{label}}` in a legend format, from a series' labels.
fn legend(format: &str, metric: &Value) -> String {
    let mut out = format.to_owned();
    while let Some(start) = out.find("{{") {
        let Some(end) = out[start..].find("}}") else {
            break;
        };
        let name = out[start + 2..start + end].trim().to_owned();
        let value = metric[&name].as_str().unwrap_or_default().to_owned();
        out.replace_range(start..start + end + 2, &value);
    }
    out.trim().to_owned()
}

async fn query(args: &Args, expr: &str, format: &str) -> Result<Vec<Series>, String> {
    let expr = expr
        .replace("$__rate_interval", &args.rate_interval)
        .replace("$connection", ".*")
        .replace("$api", ".*");
    let path = format!(
        "/api/v1/query_range?query={}&start={}&end={}&step={}",
        encode(&expr),
        args.start,
        args.end,
        args.step
    );
    let (code, body) = kbind_e2e::kbind::http_get(&args.prometheus, &path).await?;
    let answer: Value = serde_json::from_str(&body).map_err(|e| format!("{expr}: {e}"))?;
    if code != 200 || answer["status"] != "success" {
        return Err(format!("{expr}: HTTP {code}: {}", answer["error"]));
    }
    Ok(answer["data"]["result"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|r| Series {
            label: legend(format, &r["metric"]),
            points: r["values"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|p| {
                    let t = p[0].as_f64()?;
                    let v: f64 = p[1].as_str()?.parse().ok()?;
                    v.is_finite().then_some((t, v))
                })
                .collect(),
        })
        .filter(|s| !s.points.is_empty())
        .collect())
}

/// A value in a panel's unit.
fn format_value(value: f64, unit: &str) -> String {
    let number = |v: f64| {
        if (v.fract() == 0.0 && v.abs() < 1e15) || v.abs() >= 100.0 {
            format!("{v:.0}")
        } else if v.abs() >= 10.0 {
            format!("{v:.1}")
        } else {
            format!("{v:.2}")
        }
    };
    match unit {
        "s" if value != 0.0 && value.abs() < 1.0 => format!("{} ms", number(value * 1000.0)),
        "s" => format!("{} s", number(value)),
        "ops" => format!("{} ops/s", number(value)),
        "reqps" => format!("{} req/s", number(value)),
        _ => number(value),
    }
}

fn clock(t: f64) -> String {
    let seconds = (t as i64).rem_euclid(86_400);
    format!(
        "{:02}:{:02}:{:02}",
        seconds / 3600,
        seconds / 60 % 60,
        seconds % 60
    )
}

fn chart(args: &Args, series: &[Series], unit: &str, w: f64, h: f64) -> String {
    let (left, right, top, bottom) = (64.0, 10.0, 6.0, 22.0);
    let (pw, ph) = (w - left - right, h - top - bottom);
    let max = series
        .iter()
        .flat_map(|s| s.points.iter().map(|p| p.1))
        .fold(0.0_f64, f64::max);
    let max = if max > 0.0 { max * 1.1 } else { 1.0 };
    let x = |t: f64| left + (t - args.start) / (args.end - args.start) * pw;
    let y = |v: f64| top + ph - v / max * ph;
    let mut svg = format!(r#"<svg width="{w}" height="{h}" xmlns="http://www.w3.org/2000/svg">"#);
    for i in 0..=4 {
        let v = max * f64::from(i) / 4.0;
        let _ = write!(
            svg,
            r##"<line x1="{left}" x2="{}" y1="{y:.1}" y2="{y:.1}" stroke="#2c3235"/><text x="{}" y="{:.1}" fill="#9fa7b3" font-size="11" text-anchor="end">{}</text>"##,
            left + pw,
            left - 6.0,
            y(v) + 4.0,
            escape(&format_value(v, unit)),
            y = y(v),
        );
    }
    // A time label takes about 60 px: as many as fit, at least the two ends.
    let ticks = ((pw / 110.0).floor() as u32).clamp(1, 4);
    for i in 0..=ticks {
        let t = args.start + (args.end - args.start) * f64::from(i) / f64::from(ticks);
        let anchor = match i {
            0 => "start",
            i if i == ticks => "end",
            _ => "middle",
        };
        let _ = write!(
            svg,
            r##"<text x="{:.1}" y="{}" fill="#9fa7b3" font-size="11" text-anchor="{anchor}">{}</text>"##,
            x(t),
            h - 6.0,
            clock(t)
        );
    }
    for (i, s) in series.iter().enumerate() {
        let points: Vec<String> = s
            .points
            .iter()
            .map(|(t, v)| format!("{:.1},{:.1}", x(*t), y(*v)))
            .collect();
        let _ = write!(
            svg,
            r#"<polyline fill="none" stroke="{}" stroke-width="2" points="{}"/>"#,
            PALETTE[i % PALETTE.len()],
            points.join(" ")
        );
    }
    svg.push_str("</svg>");
    svg
}

/// A stat panel's background: the series as a filled area.
fn sparkline(args: &Args, series: &Series, w: f64, h: f64) -> String {
    let max = series.points.iter().map(|p| p.1).fold(0.0_f64, f64::max);
    let max = if max > 0.0 { max } else { 1.0 };
    let x = |t: f64| (t - args.start) / (args.end - args.start) * w;
    let y = |v: f64| h - v / max * h * 0.9;
    let mut points: Vec<String> = vec![format!("{:.1},{h}", x(series.points[0].0))];
    points.extend(
        series
            .points
            .iter()
            .map(|(t, v)| format!("{:.1},{:.1}", x(*t), y(*v))),
    );
    points.push(format!(
        "{:.1},{h}",
        x(series.points[series.points.len() - 1].0)
    ));
    format!(
        r##"<svg class="spark" width="{w}" height="{h}"><polygon fill="#73bf69" fill-opacity="0.15" stroke="#73bf69" stroke-opacity="0.5" points="{}"/></svg>"##,
        points.join(" ")
    )
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), String> {
    let args = Args::parse();
    let text = std::fs::read_to_string(&args.dashboard).map_err(|e| e.to_string())?;
    let dashboard: Value = serde_json::from_str(&text).map_err(|e| e.to_string())?;
    let column = (WIDTH - 2.0 * MARGIN) / 24.0;
    let mut body = String::new();
    let mut bottom: f64 = 0.0;
    for panel in dashboard["panels"].as_array().into_iter().flatten() {
        let grid = &panel["gridPos"];
        let number = |key: &str| grid[key].as_f64().unwrap_or_default();
        let (left, top) = (
            MARGIN + number("x") * column,
            HEADER + number("y") * ROW_UNIT,
        );
        let (w, h) = (
            number("w") * column - MARGIN,
            number("h") * ROW_UNIT - MARGIN,
        );
        bottom = bottom.max(top + h + MARGIN);
        let title = escape(panel["title"].as_str().unwrap_or_default());
        if panel["type"] == "row" {
            let _ = write!(
                body,
                r#"<div class="row" style="left:{left}px;top:{top}px;width:{w}px">{title}</div>"#
            );
            continue;
        }
        let unit = panel["fieldConfig"]["defaults"]["unit"]
            .as_str()
            .unwrap_or("short");
        let mut series = Vec::new();
        for target in panel["targets"].as_array().into_iter().flatten() {
            let expr = target["expr"].as_str().unwrap_or_default();
            let format = target["legendFormat"].as_str().unwrap_or_default();
            series.extend(query(&args, expr, format).await?);
        }
        let content = if panel["type"] == "stat" {
            let values: Vec<String> = series
                .iter()
                .filter_map(|s| s.points.last())
                .map(|p| format_value(p.1, unit))
                .collect();
            let shown = if values.is_empty() {
                "No data".to_owned()
            } else {
                values.join(" / ")
            };
            // Grafana's stat "area" mode: the first series drawn faintly behind the value.
            let spark = series
                .first()
                .map(|s| sparkline(&args, s, w - 16.0, h - 40.0))
                .unwrap_or_default();
            format!(r#"<div class="stat">{}</div>{spark}"#, escape(&shown))
        } else {
            let legend: String = series
                .iter()
                .enumerate()
                .map(|(i, s)| {
                    format!(
                        r#"<span><i style="background:{}"></i>{}</span>"#,
                        PALETTE[i % PALETTE.len()],
                        escape(&s.label)
                    )
                })
                .collect();
            // The legend wraps: about 7 px per character, 15 px per line.
            let legend_width: f64 = series
                .iter()
                .map(|s| 28.0 + 6.5 * s.label.chars().count() as f64)
                .sum();
            let legend_lines = (legend_width / (w - 16.0)).ceil().max(1.0);
            let chart = if series.is_empty() {
                r#"<div class="stat">No data</div>"#.to_owned()
            } else {
                chart(
                    &args,
                    &series,
                    unit,
                    w - 16.0,
                    h - 36.0 - 15.0 * legend_lines,
                )
            };
            format!(r#"{chart}<div class="legend">{legend}</div>"#)
        };
        let _ = write!(
            body,
            r#"<div class="panel" style="left:{left}px;top:{top}px;width:{w}px;height:{h}px"><div class="title">{title}</div>{content}</div>"#
        );
    }
    let height = bottom.ceil() + MARGIN;
    let page = format!(
        r#"<!doctype html><html><head><meta charset="utf-8"><style>
body {{ margin:0; background:#111217; color:#ccccdc; font-family:"DejaVu Sans",sans-serif; width:{WIDTH}px; height:{height}px; position:relative; overflow:hidden }}
h1 {{ position:absolute; left:{MARGIN}px; top:6px; margin:0; font-size:20px; font-weight:500 }}
.sub {{ position:absolute; left:{MARGIN}px; top:34px; font-size:12px; color:#9fa7b3 }}
.row {{ position:absolute; font-size:14px; font-weight:600; padding-top:8px }}
.panel {{ position:absolute; background:#181b1f; border:1px solid #2c3235; border-radius:2px; padding:4px 8px; box-sizing:border-box }}
.title {{ font-size:13px; font-weight:500; margin-bottom:4px }}
.stat {{ font-size:30px; font-weight:500; color:#73bf69; margin-top:18px; text-align:center; position:relative; z-index:1 }}
.spark {{ position:absolute; left:8px; bottom:4px }}
.legend {{ font-size:11px; color:#ccccdc; margin-top:2px }}
.legend span {{ margin-right:12px; white-space:nowrap }}
.legend i {{ display:inline-block; width:12px; height:3px; margin-right:4px; vertical-align:middle }}
</style></head><body><h1>{}</h1><div class="sub">{}</div>{body}</body></html>"#,
        escape(dashboard["title"].as_str().unwrap_or("kbind")),
        escape(&args.subtitle)
    );
    std::fs::write(&args.out, page).map_err(|e| e.to_string())?;
    println!("{height}");
    Ok(())
}
