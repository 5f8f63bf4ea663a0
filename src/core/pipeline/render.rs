//! Pictures of a simulated pipeline ([`Simulation`]), as pure functions
//! returning a `String` (`no_std` + `alloc`):
//! * [`svg`]: ranks as rows, time on x, one box per operation — forward
//!   blue, backward (full or input-gradient `B`) green, weight gradient `W`
//!   orange, a darker shade per chunk (virtual stage) — with the micro-batch
//!   number inside each box, a time axis, a legend, and the makespan and
//!   bubble in the title, like the figures of the Megatron interleaving and
//!   zero-bubble papers. Every operation is exactly one `<rect>` (with a
//!   `<title>` tooltip); nothing else is drawn with `<rect>`.
//! * [`ascii`]: one line per rank, one character per time column (digits,
//!   lower- and upper-case letters for F, B, W of a micro-batch mod 10),
//!   followed by a legend.

use alloc::string::String;
use core::fmt::Write;

use super::{Pass, Simulation, Span};

/// Shades per pass, lightest (chunk 0) to darkest; chunks cycle through them.
const FORWARD: [&str; 4] = ["#4e79a7", "#35608f", "#224873", "#123156"];
const BACKWARD: [&str; 4] = ["#59a14f", "#418639", "#2d6a26", "#1b4e16"];
const WEIGHT: [&str; 4] = ["#f28e2b", "#d27516", "#a95b0b", "#7d4205"];

fn colour(pass: Pass, chunk: usize) -> &'static str {
    let shades = match pass {
        Pass::Forward => &FORWARD,
        Pass::Backward | Pass::BackwardInput => &BACKWARD,
        Pass::BackwardWeight => &WEIGHT,
    };
    shades[chunk % shades.len()]
}

fn pass_letter(pass: Pass) -> &'static str {
    match pass {
        Pass::Forward => "F",
        Pass::Backward => "B (full)",
        Pass::BackwardInput => "B",
        Pass::BackwardWeight => "W",
    }
}

/// Appends `s` with the XML special characters escaped.
fn escape_into(out: &mut String, s: &str) {
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&apos;"),
            c => out.push(c),
        }
    }
}

/// The shortest positive operation duration (`None`: no such operation).
fn shortest(sim: &Simulation) -> Option<f64> {
    sim.timeline
        .iter()
        .flatten()
        .map(Span::duration)
        .filter(|d| *d > 0.0)
        .fold(None, |m: Option<f64>, d| Some(m.map_or(d, |m| m.min(d))))
}

/// A tick step of 1, 2 or 5 times a power of ten giving at most ~20 ticks.
fn tick_step(makespan: f64) -> f64 {
    let mut step = 1e-6;
    while makespan / step > 20.0 {
        for m in [2.0, 2.5, 2.0] {
            step *= m;
            if makespan / step <= 20.0 {
                return step;
            }
        }
    }
    step
}

/// The simulation as a standalone SVG document. `title` is escaped; the
/// makespan and the bubble fraction are appended to it.
pub fn svg(sim: &Simulation, title: &str) -> String {
    const LEFT: f64 = 70.0;
    const RIGHT: f64 = 20.0;
    const TOP: f64 = 44.0;
    const ROW: f64 = 28.0;
    const GAP: f64 = 6.0;

    let pp = sim.ranks();
    let chunks = sim.chunks();
    let makespan = sim.makespan;
    // Pixels per time unit: at least 1000 px of chart, the shortest op at
    // least 18 px wide when that keeps the chart under 4000 px.
    let scale = if makespan > 0.0 {
        let base = 1000.0 / makespan;
        let readable = shortest(sim).map_or(base, |d| (18.0 / d).min(4000.0 / makespan));
        base.max(readable)
    } else {
        1.0
    };
    let chart_w = if makespan > 0.0 {
        makespan * scale
    } else {
        1000.0
    };
    let rows_h = pp as f64 * (ROW + GAP);
    let axis_y = TOP + rows_h + 4.0;
    let legend_y = axis_y + 36.0;
    let width = LEFT + chart_w + RIGHT;
    let height = legend_y + if chunks > 1 { 52.0 } else { 28.0 };

    let mut out = String::new();
    let _ = writeln!(
        out,
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{width:.0}\" height=\"{height:.0}\" \
         viewBox=\"0 0 {width:.0} {height:.0}\" font-family=\"sans-serif\" \
         style=\"background:#ffffff\">"
    );

    // Title.
    out.push_str("<text x=\"10\" y=\"24\" font-size=\"16\" font-weight=\"bold\">");
    escape_into(&mut out, title);
    let _ = writeln!(
        out,
        " \u{2014} makespan {:.2}, bubble {:.1}%</text>",
        makespan,
        sim.bubble_fraction * 100.0
    );

    // Rows: label, baseline, operations.
    for (rank, spans) in sim.timeline.iter().enumerate() {
        let y = TOP + rank as f64 * (ROW + GAP);
        let _ = writeln!(
            out,
            "<text x=\"{:.1}\" y=\"{:.1}\" font-size=\"12\" text-anchor=\"end\">rank {rank}</text>",
            LEFT - 8.0,
            y + ROW / 2.0 + 4.0
        );
        let _ = writeln!(
            out,
            "<line x1=\"{LEFT:.1}\" y1=\"{:.1}\" x2=\"{:.1}\" y2=\"{:.1}\" stroke=\"#dddddd\"/>",
            y + ROW,
            LEFT + chart_w,
            y + ROW
        );
        for s in spans {
            let x = LEFT + s.start * scale;
            let w = s.duration() * scale;
            let fill = colour(s.op.pass, s.op.chunk);
            let _ = write!(
                out,
                "<rect class=\"op\" x=\"{x:.2}\" y=\"{y:.1}\" width=\"{w:.2}\" height=\"{ROW:.1}\" \
                 fill=\"{fill}\" stroke=\"#ffffff\" stroke-width=\"1\"><title>{} micro-batch {}",
                pass_letter(s.op.pass),
                s.op.microbatch
            );
            if chunks > 1 {
                let _ = write!(out, " chunk {}", s.op.chunk);
            }
            let _ = writeln!(
                out,
                " (stage {}): {:.3} \u{2013} {:.3}</title></rect>",
                s.op.stage, s.start, s.end
            );
            let label_w = if s.op.microbatch >= 10 { 16.0 } else { 9.0 };
            if w >= label_w {
                let text_fill = if matches!(s.op.pass, Pass::BackwardWeight) && s.op.chunk == 0 {
                    "#000000"
                } else {
                    "#ffffff"
                };
                let _ = writeln!(
                    out,
                    "<text x=\"{:.2}\" y=\"{:.1}\" font-size=\"11\" text-anchor=\"middle\" \
                     fill=\"{text_fill}\">{}</text>",
                    x + w / 2.0,
                    y + ROW / 2.0 + 4.0,
                    s.op.microbatch
                );
            }
        }
    }
    if pp == 0 {
        let _ = writeln!(
            out,
            "<text x=\"{LEFT:.1}\" y=\"{:.1}\" font-size=\"12\" fill=\"#777777\">empty schedule</text>",
            TOP + 14.0
        );
    }

    // Time axis.
    let _ = writeln!(
        out,
        "<line x1=\"{LEFT:.1}\" y1=\"{axis_y:.1}\" x2=\"{:.1}\" y2=\"{axis_y:.1}\" stroke=\"#333333\"/>",
        LEFT + chart_w
    );
    if makespan > 0.0 {
        let step = tick_step(makespan);
        let mut i = 0u32;
        loop {
            let t = f64::from(i) * step;
            if t > makespan * (1.0 + 1e-9) {
                break;
            }
            let x = LEFT + t * scale;
            let _ = writeln!(
                out,
                "<line x1=\"{x:.2}\" y1=\"{axis_y:.1}\" x2=\"{x:.2}\" y2=\"{:.1}\" stroke=\"#333333\"/>\
                 <text x=\"{x:.2}\" y=\"{:.1}\" font-size=\"10\" text-anchor=\"middle\">{}</text>",
                axis_y + 4.0,
                axis_y + 16.0,
                Trim(t)
            );
            i += 1;
        }
    }
    let _ = writeln!(
        out,
        "<text x=\"{:.1}\" y=\"{:.1}\" font-size=\"10\" text-anchor=\"end\">time</text>",
        LEFT + chart_w,
        axis_y + 28.0
    );

    // Legend: swatches are paths, so `<rect` counts operations only.
    out.push_str("<g class=\"legend\">\n");
    let mut x = LEFT;
    let entries = [
        (FORWARD[0], "F forward"),
        (BACKWARD[0], "B backward (input gradient, or full)"),
        (WEIGHT[0], "W weight gradient"),
    ];
    for (fill, label) in entries {
        swatch(&mut out, x, legend_y, fill, label);
        x += 30.0 + 7.0 * label.len() as f64;
    }
    let _ = writeln!(
        out,
        "<text x=\"{x:.1}\" y=\"{:.1}\" font-size=\"12\">number = micro-batch</text>",
        legend_y + 11.0
    );
    if chunks > 1 {
        let mut x = LEFT;
        for (c, fill) in FORWARD.iter().enumerate().take(chunks) {
            let mut label = String::new();
            let _ = write!(label, "chunk {c}");
            if chunks > FORWARD.len() && c == FORWARD.len() - 1 {
                label.push_str(" (shades cycle)");
            }
            if c == 0 {
                label.push_str(" (darker: later chunks, every pass)");
            }
            swatch(&mut out, x, legend_y + 24.0, fill, &label);
            x += 30.0 + 7.0 * label.len() as f64;
        }
    }
    out.push_str("</g>\n</svg>\n");
    out
}

fn swatch(out: &mut String, x: f64, y: f64, fill: &str, label: &str) {
    let _ = write!(
        out,
        "<path d=\"M{x:.1} {y:.1}h14v14h-14z\" fill=\"{fill}\"/>\
         <text x=\"{:.1}\" y=\"{:.1}\" font-size=\"12\">",
        x + 20.0,
        y + 11.0
    );
    escape_into(out, label);
    out.push_str("</text>\n");
}

/// Formats a tick value without trailing zeros.
struct Trim(f64);

impl core::fmt::Display for Trim {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        let mut s = String::new();
        let _ = write!(s, "{:.3}", self.0);
        let s = s.trim_end_matches('0').trim_end_matches('.');
        f.write_str(if s.is_empty() || s == "-" { "0" } else { s })
    }
}

/// The character of one operation in [`ascii`].
fn glyph(s: &Span) -> char {
    let d = (s.op.microbatch % 10) as u8;
    char::from(match s.op.pass {
        Pass::Forward => b'0' + d,
        Pass::Backward | Pass::BackwardInput => b'a' + d,
        Pass::BackwardWeight => b'A' + d,
    })
}

/// The simulation as text: one line `rank r |…|` per rank, one character
/// per time column (the operation running at the column's middle), then a
/// legend. `width` is the number of columns; 0 picks one column per
/// shortest operation (at most 240 columns).
pub fn ascii(sim: &Simulation, width: usize) -> String {
    const AUTO_MAX: usize = 240;
    let makespan = sim.makespan;
    let columns = if makespan <= 0.0 {
        0
    } else if width > 0 {
        width
    } else {
        let unit = shortest(sim).unwrap_or(makespan);
        let n = makespan / unit - 1e-9;
        let mut c = 0usize;
        while (c as f64) < n && c < AUTO_MAX {
            c += 1;
        }
        c.max(1)
    };
    let unit = if columns > 0 {
        makespan / columns as f64
    } else {
        0.0
    };

    let pp = sim.ranks();
    let label_w = {
        let mut digits = 1;
        let mut n = pp.saturating_sub(1);
        while n >= 10 {
            digits += 1;
            n /= 10;
        }
        digits
    };
    let mut out = String::new();
    for (rank, spans) in sim.timeline.iter().enumerate() {
        let _ = write!(out, "rank {rank:>label_w$} |");
        let mut i = 0;
        for c in 0..columns {
            let t = (c as f64 + 0.5) * unit;
            while i < spans.len() && spans[i].end <= t {
                i += 1;
            }
            match spans.get(i) {
                Some(s) if s.start <= t => out.push(glyph(s)),
                _ => out.push('.'),
            }
        }
        out.push_str("|\n");
    }
    if pp == 0 {
        out.push_str("(empty schedule: no ranks)\n");
    }
    let _ = writeln!(
        out,
        "legend: 0-9 forward F of micro-batch (mod 10), a-j backward B (input gradient or full) \
         of micro-batch 0-9 (mod 10), A-J weight gradient W, . idle; one column = {} time units; \
         makespan {:.2}, bubble {:.1}%",
        Trim(unit),
        makespan,
        sim.bubble_fraction * 100.0
    );
    out
}
