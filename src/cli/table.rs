//! A table for people: columns padded to their widest cell.

/// Rows under a header, printed with each column as wide as its widest cell.
pub(super) struct Table {
    rows: Vec<Vec<String>>,
}

impl Table {
    pub(super) fn new<const N: usize>(header: [&str; N]) -> Self {
        Table {
            rows: vec![header.iter().map(|h| h.to_string()).collect()],
        }
    }

    pub(super) fn row<const N: usize>(&mut self, cells: [&str; N]) {
        // A cell is one line: a newline or a tab in data would break the columns.
        let clean = |c: &str| c.replace(['\n', '\r', '\t'], " ");
        self.rows.push(cells.iter().map(|c| clean(c)).collect());
    }

    pub(super) fn render(&self) -> String {
        let columns = self.rows.iter().map(Vec::len).max().unwrap_or(0);
        let widths: Vec<usize> = (0..columns)
            .map(|i| {
                self.rows
                    .iter()
                    .filter_map(|r| r.get(i))
                    .map(|c| c.chars().count())
                    .max()
                    .unwrap_or(0)
            })
            .collect();
        let mut out = String::new();
        for row in &self.rows {
            let mut line = String::new();
            for (i, cell) in row.iter().enumerate() {
                if i + 1 == row.len() {
                    line.push_str(cell);
                } else {
                    let pad = widths[i] - cell.chars().count();
                    line.push_str(cell);
                    line.push_str(&" ".repeat(pad + 2));
                }
            }
            out.push_str(line.trim_end());
            out.push('\n');
        }
        if self.rows.len() == 1 {
            out.push_str("(none)\n");
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn columns_line_up_and_cells_stay_on_one_line() {
        let mut t = Table::new(["a", "bb"]);
        t.row(["long cell", "x\ny"]);
        assert_eq!(t.render(), "a          bb\nlong cell  x y\n");
        assert_eq!(Table::new(["a"]).render(), "a\n(none)\n");
    }
}
