/** The submit form's "Script arguments" line, split into argv words. */

/**
 * Split an argument line like a POSIX shell would for words and quotes (no expansion):
 * `--lr 3e-3 --name "my run"` → `['--lr', '3e-3', '--name', 'my run']`.
 *
 * @throws {Error} on an unterminated quote
 */
export function splitArgs(line: string): string[] {
  const out: string[] = [];
  let cur = '';
  let inWord = false;
  let quote: '"' | "'" | null = null;
  for (let i = 0; i < line.length; i++) {
    const c = line[i];
    if (quote) {
      if (c === quote) {
        quote = null;
      } else if (c === '\\' && quote === '"' && i + 1 < line.length) {
        cur += line[++i];
      } else {
        cur += c;
      }
    } else if (c === '"' || c === "'") {
      quote = c;
      inWord = true;
    } else if (c === '\\' && i + 1 < line.length) {
      cur += line[++i];
      inWord = true;
    } else if (/\s/.test(c)) {
      if (inWord) {
        out.push(cur);
        cur = '';
        inWord = false;
      }
    } else {
      cur += c;
      inWord = true;
    }
  }
  if (quote) {
    throw new Error(`arguments: unterminated ${quote} quote`);
  }
  if (inWord) {
    out.push(cur);
  }
  return out;
}
