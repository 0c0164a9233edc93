//! The trigger-mode experiment's latency distributions as an SVG: one panel per event-loss rate,
//! one cumulative distribution per mode, latency on a log axis.

use std::fmt::Write;

use crate::experiment::CellResult;

const PANEL_W: f64 = 380.0;
const PANEL_H: f64 = 260.0;
const MARGIN_L: f64 = 50.0;
const MARGIN_T: f64 = 40.0;
const MARGIN_B: f64 = 45.0;
const COLORS: &[&str] = &["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b"];

pub fn latency_cdf_svg(cells: &[CellResult]) -> String {
    let grid: Vec<&CellResult> = cells.iter().filter(|c| c.grid).collect();
    let mut losses: Vec<f64> = Vec::new();
    let mut modes: Vec<&str> = Vec::new();
    for c in &grid {
        if !losses.iter().any(|l| (l - c.loss).abs() < 1e-9) {
            losses.push(c.loss);
        }
        if !modes.contains(&c.mode.as_str()) {
            modes.push(&c.mode);
        }
    }
    let all: Vec<f64> = grid.iter().flat_map(|c| c.latencies_ms.iter().copied()).filter(|v| *v > 0.0).collect();
    let lo = all.iter().copied().fold(f64::INFINITY, f64::min).max(0.1);
    let hi = all.iter().copied().fold(0.0, f64::max).max(lo * 10.0);
    let (lo_dec, hi_dec) = (lo.log10().floor(), hi.log10().ceil());

    let width = MARGIN_L + losses.len().max(1) as f64 * (PANEL_W + MARGIN_L);
    let height = MARGIN_T + PANEL_H + MARGIN_B + 20.0 * modes.len() as f64 + 20.0;
    let mut s = String::new();
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{width:.0}" height="{height:.0}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(s, r#"<rect width="100%" height="100%" fill="white"/>"#);
    for (pi, loss) in losses.iter().enumerate() {
        let x0 = MARGIN_L + pi as f64 * (PANEL_W + MARGIN_L);
        let y0 = MARGIN_T;
        let x_of = |ms: f64| x0 + (ms.max(lo).log10() - lo_dec) / (hi_dec - lo_dec) * PANEL_W;
        let y_of = |q: f64| y0 + PANEL_H - q * PANEL_H;
        let _ = writeln!(
            s,
            r#"<text x="{:.1}" y="{:.1}" text-anchor="middle" font-weight="bold">{}% of watch events lost</text>"#,
            x0 + PANEL_W / 2.0,
            y0 - 12.0,
            loss * 100.0
        );
        let _ = writeln!(s, r##"<rect x="{x0:.1}" y="{y0:.1}" width="{PANEL_W}" height="{PANEL_H}" fill="none" stroke="#444"/>"##);
        let mut d = lo_dec;
        while d <= hi_dec {
            let x = x_of(10f64.powf(d));
            let label = if d >= 3.0 { format!("{}s", 10f64.powf(d - 3.0)) } else { format!("{}ms", 10f64.powf(d)) };
            let _ = writeln!(
                s,
                r##"<line x1="{x:.1}" y1="{y0:.1}" x2="{x:.1}" y2="{:.1}" stroke="#ddd"/><text x="{x:.1}" y="{:.1}" text-anchor="middle">{label}</text>"##,
                y0 + PANEL_H,
                y0 + PANEL_H + 15.0
            );
            d += 1.0;
        }
        for q in [0.0, 0.5, 0.99, 1.0] {
            let y = y_of(q);
            let _ = writeln!(
                s,
                r##"<line x1="{x0:.1}" y1="{y:.1}" x2="{:.1}" y2="{y:.1}" stroke="#eee"/><text x="{:.1}" y="{:.1}" text-anchor="end">{q}</text>"##,
                x0 + PANEL_W,
                x0 - 4.0,
                y + 4.0
            );
        }
        let _ = writeln!(
            s,
            r#"<text x="{:.1}" y="{:.1}" text-anchor="middle">spec change to converged status (log scale)</text>"#,
            x0 + PANEL_W / 2.0,
            y0 + PANEL_H + 32.0
        );
        for (mi, mode) in modes.iter().enumerate() {
            let Some(c) = grid.iter().find(|c| c.mode == *mode && (c.loss - loss).abs() < 1e-9) else { continue };
            if c.latencies_ms.is_empty() || c.changes == 0 {
                continue;
            }
            // The curve ends below 1 when changes never converged: the share that did.
            let n = c.changes as f64;
            let mut points = String::new();
            for (i, v) in c.latencies_ms.iter().enumerate() {
                let _ = write!(points, "{:.1},{:.1} ", x_of(*v), y_of((i + 1) as f64 / n));
            }
            let _ = writeln!(
                s,
                r#"<polyline points="{points}" fill="none" stroke="{}" stroke-width="1.8"/>"#,
                COLORS[mi % COLORS.len()]
            );
        }
    }
    let ly = MARGIN_T + PANEL_H + MARGIN_B + 10.0;
    for (mi, mode) in modes.iter().enumerate() {
        let y = ly + mi as f64 * 20.0;
        let _ = writeln!(
            s,
            r#"<line x1="{MARGIN_L}" y1="{y:.1}" x2="{:.1}" y2="{y:.1}" stroke="{}" stroke-width="3"/><text x="{:.1}" y="{:.1}">{mode}</text>"#,
            MARGIN_L + 30.0,
            COLORS[mi % COLORS.len()],
            MARGIN_L + 38.0,
            y + 4.0
        );
    }
    let _ = writeln!(
        s,
        r#"<text x="{:.1}" y="{:.1}">Y: fraction of changes converged (a curve ending below 1: the rest never converged)</text>"#,
        MARGIN_L + 200.0,
        ly + 4.0
    );
    s.push_str("</svg>\n");
    s
}
