//! Report output: Markdown tables and PNG line plots (plotters, bitmap backend). Text in the
//! plots needs a TrueType font; the bitmap backend's `ab_glyph` renderer takes one from a file
//! so that nothing depends on fontconfig (Debian: fonts-dejavu-core).

use std::path::Path;
use std::sync::OnceLock;

use plotters::prelude::*;
use plotters::style::FontStyle;

/// Fonts tried in order.
const FONTS: &[&str] = &[
    "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/dejavu/DejaVuSans.ttf",
];

/// A Markdown table built row by row.
pub struct Table {
    head: Vec<String>,
    rows: Vec<Vec<String>>,
}

impl Table {
    pub fn new(head: &[&str]) -> Table {
        Table {
            head: head.iter().map(|s| s.to_string()).collect(),
            rows: Vec::new(),
        }
    }

    pub fn row(&mut self, cells: Vec<String>) {
        debug_assert_eq!(cells.len(), self.head.len());
        self.rows.push(cells);
    }

    pub fn is_empty(&self) -> bool {
        self.rows.is_empty()
    }

    pub fn markdown(&self) -> String {
        let mut s = format!("| {} |\n", self.head.join(" | "));
        s += &format!("|{}\n", "---|".repeat(self.head.len()));
        for r in &self.rows {
            s += &format!("| {} |\n", r.join(" | "));
        }
        s
    }
}

/// One line of a plot.
pub struct Series {
    pub name: String,
    pub points: Vec<(f64, f64)>,
    /// Modeled lines are drawn dashed-looking (thin, no markers) so they never pass for
    /// measurements.
    pub modeled: bool,
}

fn font_ready() -> Result<(), String> {
    static READY: OnceLock<Result<(), String>> = OnceLock::new();
    READY
        .get_or_init(|| {
            for f in FONTS {
                if let Ok(bytes) = std::fs::read(f) {
                    let bytes: &'static [u8] = bytes.leak();
                    return plotters::style::register_font("sans-serif", FontStyle::Normal, bytes)
                        .map_err(|_| format!("{f}: not a usable font"));
                }
            }
            Err(format!(
                "no font for plot text (looked for {}; install fonts-dejavu-core)",
                FONTS.join(", ")
            ))
        })
        .clone()
}

/// Draws `series` as lines with markers into a PNG at `out`. `log_x` for power-of-two axes.
pub fn line_plot(
    out: &Path,
    title: &str,
    x_label: &str,
    y_label: &str,
    series: &[Series],
    log_x: bool,
) -> Result<(), String> {
    font_ready()?;
    let pts = series.iter().flat_map(|s| s.points.iter());
    let (mut x0, mut x1, mut y1) = (f64::MAX, f64::MIN, 0f64);
    for &(x, y) in pts {
        x0 = x0.min(x);
        x1 = x1.max(x);
        y1 = y1.max(y);
    }
    if x0 > x1 {
        return Err(format!("{title}: nothing to plot"));
    }
    if x0 == x1 {
        x1 = x0 + 1.0;
    }
    let y1 = if y1 <= 0.0 { 1.0 } else { y1 * 1.1 };
    let root = BitMapBackend::new(out, (1000, 620)).into_drawing_area();
    let e = |e: DrawingAreaErrorKind<_>| format!("{}: {e:?}", out.display());
    root.fill(&WHITE).map_err(e)?;
    let colors = [
        RGBColor(31, 119, 180),
        RGBColor(214, 39, 40),
        RGBColor(44, 160, 44),
        RGBColor(148, 103, 189),
        RGBColor(255, 127, 14),
        RGBColor(127, 127, 127),
        RGBColor(23, 190, 207),
        RGBColor(188, 189, 34),
    ];
    macro_rules! draw {
        ($chart:expr) => {{
            let mut chart = $chart;
            chart
                .configure_mesh()
                .light_line_style(WHITE)
                .x_label_formatter(&|x| format!("{x:.0}"))
                .x_desc(x_label)
                .y_desc(y_label)
                .draw()
                .map_err(e)?;
            // A modeled line takes the colour of the measured line before it.
            let mut ci = 0usize;
            for s in series.iter() {
                if !s.modeled {
                    ci += 1;
                }
                let c = colors[ci.max(1).wrapping_sub(1) % colors.len()];
                let width = if s.modeled { 1 } else { 2 };
                chart
                    .draw_series(LineSeries::new(
                        s.points.iter().copied(),
                        c.stroke_width(width),
                    ))
                    .map_err(e)?
                    .label(s.name.clone())
                    .legend(move |(x, y)| {
                        PathElement::new(vec![(x, y), (x + 20, y)], c.stroke_width(width))
                    });
                if !s.modeled {
                    chart
                        .draw_series(
                            s.points
                                .iter()
                                .map(|&(x, y)| Circle::new((x, y), 3, c.filled())),
                        )
                        .map_err(e)?;
                }
            }
            chart
                .configure_series_labels()
                .background_style(WHITE.mix(0.85))
                .border_style(BLACK)
                .position(SeriesLabelPosition::UpperRight)
                .draw()
                .map_err(e)?;
        }};
    }
    let mut b = ChartBuilder::on(&root);
    b.caption(title, ("sans-serif", 22))
        .margin(12)
        .x_label_area_size(45)
        .y_label_area_size(70);
    if log_x {
        draw!(b
            .build_cartesian_2d((x0..x1).log_scale(), 0f64..y1)
            .map_err(e)?);
    } else {
        draw!(b.build_cartesian_2d(x0..x1, 0f64..y1).map_err(e)?);
    }
    root.present().map_err(e)?;
    Ok(())
}

/// A short description of the machine for report headers: CPU model, cores, kernel.
pub fn machine() -> String {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split_once(':'))
                .map(|(_, v)| v.trim().to_owned())
        })
        .unwrap_or_else(|| "unknown CPU".into());
    // Not available_parallelism: EAL pins the calling thread to one core.
    let cores = std::fs::read_to_string("/proc/cpuinfo")
        .map(|s| s.lines().filter(|l| l.starts_with("processor")).count())
        .unwrap_or(0);
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .map(|s| s.trim().to_owned())
        .unwrap_or_default();
    format!("{cpu}, {cores} cores, Linux {kernel}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn markdown_table() {
        let mut t = Table::new(&["a", "b"]);
        assert!(t.is_empty());
        t.row(vec!["1".into(), "2".into()]);
        assert_eq!(t.markdown(), "| a | b |\n|---|---|\n| 1 | 2 |\n");
    }

    #[test]
    fn plot_writes_a_png() {
        if font_ready().is_err() {
            eprintln!("no font: skipped");
            return;
        }
        let dir = std::env::temp_dir().join(format!("apps-plot-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let f = dir.join("t.png");
        let s = [
            Series {
                name: "measured".into(),
                points: vec![(1.0, 1.0), (8.0, 3.0), (64.0, 2.0)],
                modeled: false,
            },
            Series {
                name: "modeled".into(),
                points: vec![(1.0, 2.0), (64.0, 4.0)],
                modeled: true,
            },
        ];
        line_plot(&f, "t", "x", "y", &s, true).unwrap();
        let bytes = std::fs::read(&f).unwrap();
        assert_eq!(&bytes[1..4], b"PNG");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
