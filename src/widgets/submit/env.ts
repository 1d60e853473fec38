/**
 * The submit form's environment check: the notebook's environment against the chosen
 * cluster's interpreter (`GET clusters/{name}/env`) as compact rows, an error-level difference
 * blocking Submit unless the user chooses "Submit anyway", and "Export requirements".
 */
import { HyperPodAPIError } from '../../api/errors';
import { exportEnv, getEnvDiff } from '../../api/network';
import { IEnvDiff } from '../../api/rest';
import { button, h, liveBox } from '../dom';

/**
 * The environment section of the form and the block it puts on Submit. Its `section` stands
 * after the placement; `reasonBox` and `skipRow` stand above the Submit button.
 */
export class EnvCheck {
  /**
   * @param options.cluster - the chosen cluster profile (empty: none)
   * @param options.script - the script or notebook whose imports are compared, or null
   * @param options.onBlockChanged - the block on Submit (or its override) changed
   */
  constructor(options: {
    cluster: () => string;
    script: () => string | null;
    onBlockChanged: () => void;
  }) {
    this._cluster = options.cluster;
    this._script = options.script;
    this._onBlockChanged = options.onBlockChanged;
    this._box = liveBox('jp-HyperPod-env', 'hp-env', { 'aria-busy': 'false' });
    this._exportBox = liveBox('jp-HyperPod-env-export', 'hp-env-export');
    const exp = button('hp-env-export-button', 'Export requirements');
    exp.title = "Write this notebook's pinned packages to the cluster's shared storage";
    exp.addEventListener('click', () => void this._export());
    this.section = h(
      'fieldset',
      { class: 'jp-HyperPod-fieldset', 'data-testid': 'hp-env-section' },
      h('legend', {}, 'Environment (notebook vs cluster)'),
      this._box,
      exp,
      this._exportBox
    );
    this.reasonBox = h('div', { class: 'jp-HyperPod-error', 'data-testid': 'hp-env-block' });
    this.reasonBox.hidden = true;
    // the CLI's --skip-env-check: a deliberate override, shown only while an error blocks Submit
    this._skip = h('input', { type: 'checkbox', 'data-testid': 'hp-env-skip' });
    this._skip.addEventListener('change', () => this._setBlock(this._block));
    this.skipRow = h('div', { class: 'jp-HyperPod-field jp-HyperPod-check' },
      h('label', { title: 'The job may fail on the cluster: its interpreter lacks a compatible hyperpod-lab' },
        this._skip, ' Submit anyway, without the environment check'));
    this.skipRow.hidden = true;
  }

  /** The fieldset: the comparison and the export. */
  readonly section: HTMLElement;
  /** Why Submit is disabled, or goes on anyway (hidden without an error). */
  readonly reasonBox: HTMLDivElement;
  /** The "Submit anyway" checkbox (hidden without an error). */
  readonly skipRow: HTMLElement;

  /** The environment errors that block Submit, or null. */
  get block(): string | null {
    return this._block;
  }

  /** Whether an environment error blocks Submit (not overridden by "Submit anyway"). */
  get blocked(): boolean {
    return this._block !== null && !this._skip.checked;
  }

  /** Whether the user chose "Submit anyway" over an environment error (`skip_env_check`). */
  get skipped(): boolean {
    return this._block !== null && this._skip.checked;
  }

  /**
   * Compare the notebook's environment with the chosen cluster's interpreter (debounced; the
   * last request wins) and show it: compact rows of the warnings and errors with both
   * versions. An error-level difference disables Submit with the reason.
   */
  update(delayMs = 400): void {
    window.clearTimeout(this._timer);
    this._timer = window.setTimeout(() => void this._load(), delayMs);
  }

  /** Compare again when the cluster or the script changed since the last comparison. */
  updateIfChanged(): void {
    if (`${this._cluster()}|${this._script()}` !== this._key) {
      this.update();
    }
  }

  /** Show an environment diff (or why there is none) and block Submit on an error. */
  show(diff: IEnvDiff | null, error: HyperPodAPIError | null): void {
    const box = this._box;
    box.setAttribute('aria-busy', 'false');
    box.textContent = '';
    this._setBlock(null);
    if (error) {
      // the script field's errors (a path outside the root, a syntax error) and an unreachable
      // cluster are shown, not blocking: the submission reports them itself
      box.setAttribute('data-summary', 'unknown');
      box.appendChild(h('div', { class: 'jp-HyperPod-dim', 'data-testid': 'hp-env-error' }, error.message));
      return;
    }
    if (!diff || !diff.supported) {
      box.setAttribute('data-summary', 'unsupported');
      box.appendChild(h('div', { class: 'jp-HyperPod-dim' }, diff?.message ?? ''));
      return;
    }
    const rows = diff.differences ?? [];
    const bad = rows.filter(d => d.severity !== 'ok');
    const summary = diff.summary ?? 'ok';
    box.setAttribute('data-summary', summary);
    const warnings = bad.filter(d => d.severity === 'warning').length;
    const errors = bad.filter(d => d.severity === 'error').length;
    box.appendChild(
      h(
        'div',
        { class: `jp-HyperPod-env-summary jp-mod-${summary}`, 'data-testid': 'hp-env-summary' },
        summary === 'ok'
          ? `Environment matches ${diff.cluster} (${diff.python})`
          : `${errors ? `${errors} error${errors === 1 ? '' : 's'}` : ''}${errors && warnings ? ', ' : ''}` +
              `${warnings ? `${warnings} warning${warnings === 1 ? '' : 's'}` : ''} against ${diff.cluster} ` +
              `(${diff.python})`
      )
    );
    if (bad.length) {
      const list = h('ul', { class: 'jp-HyperPod-env-list', 'aria-label': 'Environment differences' });
      for (const d of bad) {
        list.appendChild(
          h(
            'li',
            {
              class: `jp-mod-${d.severity}`,
              'data-testid': 'hp-env-row',
              'data-item': d.item,
              'data-severity': d.severity,
              title: d.message
            },
            `${d.severity === 'error' ? 'error' : 'warning'}: ${d.item} ${d.local ?? 'missing'} (notebook) → ` +
              `${d.remote ?? 'missing'} (cluster)`
          )
        );
      }
      box.appendChild(list);
    }
    const same = rows.filter(d => d.severity === 'ok').map(d => `${d.item} ${d.local ?? ''}`.trim());
    if (same.length) {
      box.appendChild(h('div', { class: 'jp-HyperPod-dim' }, `Same: ${same.join(', ')}`));
    }
    if (errors) {
      this._setBlock(bad.filter(d => d.severity === 'error').map(d => d.message).join('; '));
    }
  }

  private _setBlock(reason: string | null): void {
    if (reason !== this._block) {
      this._skip.checked = false; // an override is for the error it was given over
    }
    this._block = reason;
    this._onBlockChanged();
    this.reasonBox.hidden = reason === null;
    this.reasonBox.textContent = reason
      ? (this.blocked ? `Submit is disabled: ${reason}` : `Submitting anyway: ${reason}`)
      : '';
    this.skipRow.hidden = reason === null;
  }

  private async _load(): Promise<void> {
    const cluster = this._cluster();
    const seq = ++this._seq;
    if (!cluster) {
      return;
    }
    this._key = `${cluster}|${this._script()}`;
    this._box.setAttribute('aria-busy', 'true');
    let diff: IEnvDiff | null = null;
    let error: HyperPodAPIError | null = null;
    try {
      diff = await getEnvDiff(cluster, this._script());
    } catch (e) {
      error =
        e instanceof HyperPodAPIError ? e : new HyperPodAPIError((e as Error).message, 0, 'Error');
    }
    if (seq !== this._seq) {
      return; // a newer choice is being checked
    }
    this.show(diff, error);
  }

  private async _export(): Promise<void> {
    const out = this._exportBox;
    out.textContent = 'Exporting…';
    try {
      const res = await exportEnv(this._cluster());
      out.textContent = '';
      out.appendChild(
        h('div', { 'data-testid': 'hp-env-export-path' }, `Wrote ${res.pins} pins to ${res.path}. Build it on the cluster with:`)
      );
      out.appendChild(h('code', { class: 'jp-HyperPod-code', 'data-testid': 'hp-env-export-command' }, res.command));
      out.appendChild(
        h('div', { class: 'jp-HyperPod-dim' }, `then set python = "${res.python}" in the cluster profile`)
      );
    } catch (e) {
      out.textContent = '';
      out.appendChild(h('div', { class: 'jp-HyperPod-error' }, (e as Error).message));
    }
  }

  private _cluster: () => string;
  private _script: () => string | null;
  private _onBlockChanged: () => void;
  private _box: HTMLDivElement;
  private _exportBox: HTMLDivElement;
  private _skip: HTMLInputElement;
  private _block: string | null = null;
  private _seq = 0;
  private _key = '';
  private _timer = 0;
}
