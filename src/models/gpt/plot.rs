//! A loss curve as a standalone SVG document: steps on x, loss on y, one
//! polyline per series (e.g. this run and a reference), axis ticks and a
//! dashed horizontal target line.

use std::fmt::Write;

/// One named series of `(step, loss)` points.
pub struct Series<'a> {
    pub name: &'a str,
    pub color: &'a str,
    pub points: &'a [(f64, f64)],
}

fn escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

/// The SVG of `series` under `title`, with a dashed line at `target`.
pub fn loss_svg(title: &str, series: &[Series<'_>], target: Option<f64>) -> String {
    let (w, h, l, r, t, b) = (720.0, 400.0, 60.0, 20.0, 40.0, 45.0);
    let all = series.iter().flat_map(|s| s.points.iter());
    let (mut x1, mut y0, mut y1) = (1.0f64, f64::INFINITY, f64::NEG_INFINITY);
    for &(x, y) in all {
        if y.is_finite() {
            x1 = x1.max(x);
            y0 = y0.min(y);
            y1 = y1.max(y);
        }
    }
    if let Some(tg) = target {
        y0 = y0.min(tg);
        y1 = y1.max(tg);
    }
    if !y0.is_finite() {
        (y0, y1) = (0.0, 1.0);
    }
    let y0 = (y0 * 2.0).floor() / 2.0;
    let y1 = ((y1 * 2.0).ceil() / 2.0).max(y0 + 0.5);
    let px = |x: f64| l + (w - l - r) * x / x1;
    let py = |y: f64| t + (h - t - b) * (y1 - y) / (y1 - y0);
    let mut s = String::new();
    let _ = writeln!(
        s,
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{w}\" height=\"{h}\" \
         font-family=\"sans-serif\" font-size=\"12\">\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n\
         <text x=\"{}\" y=\"22\" text-anchor=\"middle\" font-size=\"15\">{}</text>",
        w / 2.0,
        escape(title)
    );
    // Axes and ticks.
    let _ = writeln!(
        s,
        "<path d=\"M{l} {t} V{} H{}\" stroke=\"black\" fill=\"none\"/>",
        h - b,
        w - r
    );
    let mut y = y0;
    while y <= y1 + 1e-9 {
        let _ = writeln!(
            s,
            "<line x1=\"{l}\" x2=\"{}\" y1=\"{:.1}\" y2=\"{:.1}\" stroke=\"#ddd\"/>\
             <text x=\"{}\" y=\"{:.1}\" text-anchor=\"end\">{y:.1}</text>",
            w - r,
            py(y),
            py(y),
            l - 6.0,
            py(y) + 4.0
        );
        y += 0.5;
    }
    let step = [1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0, 200.0, 500.0, 1000.0]
        .into_iter()
        .find(|s| x1 / s <= 10.0)
        .unwrap_or(1000.0);
    let mut x = 0.0;
    while x <= x1 + 1e-9 {
        let _ = writeln!(
            s,
            "<text x=\"{:.1}\" y=\"{}\" text-anchor=\"middle\">{x}</text>",
            px(x),
            h - b + 16.0
        );
        x += step;
    }
    let _ = writeln!(
        s,
        "<text x=\"{}\" y=\"{}\" text-anchor=\"middle\">step</text>\
         <text x=\"16\" y=\"{}\" transform=\"rotate(-90 16 {})\" text-anchor=\"middle\">loss (nats / char)</text>",
        (l + w - r) / 2.0,
        h - 8.0,
        (t + h - b) / 2.0,
        (t + h - b) / 2.0
    );
    if let Some(tg) = target {
        let _ = writeln!(
            s,
            "<line x1=\"{l}\" x2=\"{}\" y1=\"{:.1}\" y2=\"{:.1}\" stroke=\"#888\" stroke-dasharray=\"6 4\"/>\
             <text x=\"{}\" y=\"{:.1}\" text-anchor=\"end\" fill=\"#666\">target {tg}</text>",
            w - r,
            py(tg),
            py(tg),
            w - r - 4.0,
            py(tg) - 5.0
        );
    }
    for (i, se) in series.iter().enumerate() {
        let pts: Vec<String> = se
            .points
            .iter()
            .filter(|p| p.1.is_finite())
            .map(|&(x, y)| format!("{:.1},{:.1}", px(x), py(y)))
            .collect();
        let _ = writeln!(
            s,
            "<polyline points=\"{}\" fill=\"none\" stroke=\"{}\" stroke-width=\"1.6\"/>\
             <rect x=\"{}\" y=\"{}\" width=\"14\" height=\"3\" fill=\"{}\"/>\
             <text x=\"{}\" y=\"{}\">{}</text>",
            pts.join(" "),
            escape(se.color),
            w - r - 230.0,
            t + 10.0 + 18.0 * i as f64,
            escape(se.color),
            w - r - 210.0,
            t + 15.0 + 18.0 * i as f64,
            escape(se.name)
        );
    }
    s.push_str("</svg>\n");
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn draws_every_finite_point_and_the_target() {
        let pts = [(0.0, 4.1), (1.0, 3.0), (2.0, f64::NAN), (3.0, 1.9)];
        let svg = loss_svg(
            "a <b>",
            &[Series {
                name: "run",
                color: "#c00",
                points: &pts,
            }],
            Some(2.0),
        );
        assert!(svg.starts_with("<svg") && svg.ends_with("</svg>\n"));
        assert!(svg.contains("a &lt;b&gt;"));
        let line = svg.lines().find(|l| l.starts_with("<polyline")).unwrap();
        let n = line
            .split("points=\"")
            .nth(1)
            .unwrap()
            .split('"')
            .next()
            .unwrap();
        assert_eq!(n.split(' ').count(), 3, "the NaN point is dropped");
        assert!(svg.contains("target 2"));
    }
}
