//! `summary.md`, appended to and flushed line by line, and echoed to stdout.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::Path;

pub struct Report {
    file: File,
}

impl Report {
    /// Opens (creating) `<dir>/summary.md` for appending.
    pub fn open(dir: &Path) -> std::io::Result<Report> {
        std::fs::create_dir_all(dir)?;
        let file = OpenOptions::new()
            .create(true)
            .append(true)
            .open(dir.join("summary.md"))?;
        Ok(Report { file })
    }

    pub fn line(&mut self, text: &str) {
        println!("{text}");
        // A full disk must not stop the measurements; stdout still has it.
        let _ = writeln!(self.file, "{text}");
        let _ = self.file.flush();
    }

    pub fn section(&mut self, title: &str) {
        self.line("");
        self.line(&format!("## {title}"));
        self.line("");
    }

    /// A markdown table header.
    pub fn header(&mut self, cols: &[&str]) {
        self.line(&format!("| {} |", cols.join(" | ")));
        self.line(&format!("|{}", " --- |".repeat(cols.len())));
    }

    /// One markdown table row.
    pub fn row(&mut self, cells: &[String]) {
        self.line(&format!("| {} |", cells.join(" | ")));
    }
}
