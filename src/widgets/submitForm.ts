/** The submit form: a script path or the current notebook, placement and the three policies. */
import { Widget } from '@lumino/widgets';

import { exportEnv, getEnvDiff, HyperPodAPIError } from '../request';
import { IAdviceQuery, ICluster, IEnvDiff, IGoodputAdvice, IJobSpec } from '../tokens';
import { button, captionedTable, duration, errorBox, fmt, h, liveBox, percent, uid } from './dom';

/** The recovery modes of the advice, in display order, with their labels. */
const ADVICE_MODES: [string, string][] = [
  ['checkpoint-restart', 'Checkpoint-restart'],
  ['checkpointless', 'Checkpointless']
];


/** Most spare nodes a JobSpec takes (`hyperpod_lab.spec.MAX_SPARES`). */
export const MAX_SPARES = 64;

/** Largest restart-storm guard K a JobSpec takes (`hyperpod_lab.spec.MAX_STORM_RESTARTS`). */
export const MAX_STORM_RESTARTS = 1000;

/** The TensorBoard modes of a JobSpec (`hyperpod_lab.spec.TENSORBOARD_MODES`), with their labels. */
const TENSORBOARD_MODES: [NonNullable<IJobSpec['tensorboard']>, string][] = [
  ['off', 'off'],
  ['rank0', 'rank 0'],
  ['all-ranks', 'all ranks']
];

/** What the form hands to its owner on submit. */
export interface ISubmitRequest {
  /** The JobSpec fields the user set (the server fills the rest with JobSpec defaults). */
  spec: Partial<IJobSpec>;
  /** Path of the notebook to submit (server root relative), or null for a script. */
  notebook: string | null;
  /** The user chose "Submit anyway" over an environment error (`skip_env_check`). */
  skipEnvCheck: boolean;
}

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

type Field = HTMLInputElement | HTMLSelectElement;

/**
 * The form. Every control is a labelled form element; Enter in any field submits.
 * Controls carry `data-field` = the JobSpec field they set (dotted for policies), which is
 * also how a server SpecError is pointed at its control.
 */
export class SubmitForm extends Widget {
  constructor(options: {
    onSubmit: (req: ISubmitRequest) => Promise<void>;
    currentNotebook: () => string | null;
    /** Ask for the goodput advice (debounced by the owner); null: the inputs are not usable. */
    requestAdvice?: (query: IAdviceQuery | null) => void;
  }) {
    super({ node: document.createElement('form') });
    this._onSubmit = options.onSubmit;
    this._requestAdvice = options.requestAdvice ?? (() => undefined);
    this._currentNotebook = options.currentNotebook;
    this.addClass('jp-HyperPod-submitForm');
    const form = this.node as HTMLFormElement;
    form.setAttribute('data-testid', 'hp-submit-form');
    form.setAttribute('aria-label', 'Submit a training job');
    form.noValidate = false;

    const sourceName = uid('hp-source');
    const scriptRadio = h('input', {
      type: 'radio',
      name: sourceName,
      value: 'script',
      checked: true,
      'data-testid': 'hp-source-script'
    });
    const nbRadio = h('input', {
      type: 'radio',
      name: sourceName,
      value: 'notebook',
      'data-testid': 'hp-source-notebook'
    });
    this._scriptRadio = scriptRadio;
    form.appendChild(
      h(
        'fieldset',
        { class: 'jp-HyperPod-fieldset' },
        h('legend', {}, 'Source'),
        h('label', { class: 'jp-HyperPod-radio' }, scriptRadio, ' Script'),
        h('label', { class: 'jp-HyperPod-radio' }, nbRadio, ' Current notebook'),
        this._text('script', 'Script path', 'examples/train_lm.py', 'path relative to the Lab root'),
        this._text('args', 'Script arguments', '', 'e.g. --steps 100 --lr 3e-3'),
        this._text(
          'secret_env',
          'Secret variables',
          '',
          "names, e.g. HF_TOKEN: values come from the server's environment and are never written"
        )
      )
    );
    this._cluster = h('select', { 'data-field': 'cluster', 'data-testid': 'hp-field-cluster' });
    form.appendChild(
      h(
        'fieldset',
        { class: 'jp-HyperPod-fieldset' },
        h('legend', {}, 'Placement'),
        this._text('name', 'Job name', 'train'),
        this._labelled('Cluster', this._cluster),
        this._number('nodes', 'Nodes', 1, 1),
        this._number('procs_per_node', 'Processes per node', 1, 1)
      )
    );
    this._fields.get('nodes')!.addEventListener('input', () => this.updateAdvice());
    form.appendChild(this._envSection());
    this._cluster.addEventListener('change', () => this.updateEnv());
    this._fields.get('script')!.addEventListener('input', () => this.updateEnv());
    scriptRadio.addEventListener('change', () => this.updateEnv());
    nbRadio.addEventListener('change', () => this.updateEnv());
    // the current notebook changes with the active tab: look again when the form is used
    form.addEventListener('focusin', () => {
      if (`${this._cluster.value}|${this._envScript()}` !== this._envKey) {
        this.updateEnv();
      }
    });
    form.appendChild(
      h(
        'fieldset',
        { class: 'jp-HyperPod-fieldset' },
        h('legend', {}, 'Resiliency'),
        this._check('resiliency.auto_resume', 'Auto-resume after a failure', true),
        this._number('resiliency.max_retries', 'Max retries', 3, 0),
        this._number('resiliency.spares', 'Spare nodes', 0, 0, undefined, MAX_SPARES),
        this._number(
          'resiliency.storm_restarts',
          'Restart-storm guard K',
          3,
          1,
          undefined,
          MAX_STORM_RESTARTS,
          `stop after K restarts in a row without progress (1 to ${MAX_STORM_RESTARTS})`
        ),
        this._check('resiliency.health_checks', 'Node health checks', true)
      )
    );
    form.appendChild(
      h(
        'fieldset',
        { class: 'jp-HyperPod-fieldset' },
        h('legend', {}, 'Checkpoints (intervals in steps)'),
        this._number('checkpoint.every_steps', 'Persistent every', 20, 1),
        this._number('checkpoint.keep_last', 'Keep last', 2, 1),
        this._number('checkpoint.memory_every_steps', 'Memory tier every', null, 1, 'off'),
        this._text('checkpoint.s3_uri', 'S3 tier URI', '', 's3://bucket/prefix'),
        this._number('checkpoint.s3_every_steps', 'S3 tier every', null, 1, 'off')
      )
    );
    form.appendChild(this._adviceSection());
    const lr = h('select', { 'data-field': 'elastic.lr_rule' });
    for (const rule of ['linear', 'sqrt', 'none']) {
      lr.appendChild(h('option', { value: rule }, rule));
    }
    form.appendChild(
      h(
        'fieldset',
        { class: 'jp-HyperPod-fieldset' },
        h('legend', {}, 'Elastic (nodes)'),
        this._number('elastic.min_nodes', 'Min nodes', null, 1, 'fixed size'),
        this._number('elastic.max_nodes', 'Max nodes', null, 1, 'fixed size'),
        this._number('elastic.global_batch_size', 'Global batch size', null, 1, 'script decides'),
        this._labelled('LR rule', lr)
      )
    );
    // after the bounds: an error naming the policy ("elastic") points at its first field
    this._fields.set('elastic.lr_rule', lr);
    const tensorboard = h('select', { 'data-field': 'tensorboard', 'data-testid': 'hp-field-tensorboard' });
    for (const [mode, label] of TENSORBOARD_MODES) {
      tensorboard.appendChild(h('option', { value: mode }, label));
    }
    this._fields.set('tensorboard', tensorboard);
    form.appendChild(
      h(
        'fieldset',
        { class: 'jp-HyperPod-fieldset' },
        h('legend', {}, 'Metrics'),
        this._labelled(
          'TensorBoard',
          tensorboard,
          'step metrics as event files in the job directory (tensorboard/)'
        )
      )
    );
    this._error = errorBox('hp-submit-error');
    this._envReason = h('div', { class: 'jp-HyperPod-error', 'data-testid': 'hp-env-block' });
    this._envReason.hidden = true;
    form.appendChild(this._envReason);
    // the CLI's --skip-env-check: a deliberate override, shown only while an error blocks Submit
    this._envSkip = h('input', { type: 'checkbox', 'data-testid': 'hp-env-skip' });
    this._envSkip.addEventListener('change', () => this._setEnvBlock(this._envBlock));
    this._envSkipRow = h('div', { class: 'jp-HyperPod-field jp-HyperPod-check' },
      h('label', { title: 'The job may fail on the cluster: its interpreter lacks a compatible hyperpod-lab' },
        this._envSkip, ' Submit anyway, without the environment check'));
    this._envSkipRow.hidden = true;
    form.appendChild(this._envSkipRow);
    this._button = button('hp-submit', 'Submit', { type: 'submit', class: 'jp-HyperPod-button jp-mod-accept' });
    form.appendChild(this._error);
    form.appendChild(this._button);
    form.addEventListener('submit', ev => {
      ev.preventDefault();
      void this.submit();
    });
    // the browser's own check (a number field's min/max/step) stops a submit before read():
    // show the form's message at that field instead of the browser's bubble, once per attempt
    form.addEventListener(
      'invalid',
      ev => {
        ev.preventDefault();
        if (this._invalidShown) {
          return;
        }
        this._invalidShown = true;
        window.setTimeout(() => (this._invalidShown = false));
        const el = ev.target as Field;
        let field = el.getAttribute('data-field');
        const label = el.id ? form.querySelector(`label[for="${el.id}"]`)?.textContent : null;
        let message = `${label ?? field ?? 'value'}: ${el.validationMessage}`;
        try {
          this.read();
        } catch (e) {
          if (e instanceof FieldError) {
            message = e.message;
            field = e.field;
          }
        }
        this._showError(message, field);
      },
      true
    );
  }

  /** Offer these clusters, keeping the current choice when it still exists. */
  setClusters(clusters: ICluster[]): void {
    const current = this._cluster.value;
    this._cluster.textContent = '';
    for (const c of clusters) {
      this._cluster.appendChild(h('option', { value: c.name }, `${c.name} (${c.orchestrator})`));
    }
    const names = clusters.map(c => c.name);
    if (names.includes(current)) {
      this._cluster.value = current;
    } else if (names.length) {
      // prefer a real cluster over the built-in local backend
      this._cluster.value = names.find(n => n !== 'local') ?? names[0];
    }
    this.updateEnv();
  }

  /**
   * Compare the notebook's environment with the chosen cluster's interpreter (debounced; the
   * last request wins) and show it: compact rows of the warnings and errors with both
   * versions. An error-level difference disables Submit with the reason.
   */
  updateEnv(delayMs = 400): void {
    window.clearTimeout(this._envTimer);
    this._envTimer = window.setTimeout(() => void this._loadEnv(), delayMs);
  }

  private _envScript(): string | null {
    if (!this._scriptRadio.checked) {
      return this._currentNotebook();
    }
    return (this._fields.get('script') as HTMLInputElement).value.trim() || null;
  }

  private async _loadEnv(): Promise<void> {
    const cluster = this._cluster.value;
    const seq = ++this._envSeq;
    if (!cluster) {
      return;
    }
    this._envKey = `${cluster}|${this._envScript()}`;
    this._envBox.setAttribute('aria-busy', 'true');
    let diff: IEnvDiff | null = null;
    let error: HyperPodAPIError | null = null;
    try {
      diff = await getEnvDiff(cluster, this._envScript());
    } catch (e) {
      error =
        e instanceof HyperPodAPIError ? e : new HyperPodAPIError((e as Error).message, 0, 'Error');
    }
    if (seq !== this._envSeq) {
      return; // a newer choice is being checked
    }
    this.showEnv(diff, error);
  }

  /** Show an environment diff (or why there is none) and block Submit on an error. */
  showEnv(diff: IEnvDiff | null, error: HyperPodAPIError | null): void {
    const box = this._envBox;
    box.setAttribute('aria-busy', 'false');
    box.textContent = '';
    this._setEnvBlock(null);
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
      this._setEnvBlock(bad.filter(d => d.severity === 'error').map(d => d.message).join('; '));
    }
  }

  private _setEnvBlock(reason: string | null): void {
    if (reason !== this._envBlock) {
      this._envSkip.checked = false; // an override is for the error it was given over
    }
    this._envBlock = reason;
    const blocked = this._blocked();
    this._button.disabled = blocked;
    this._button.title = blocked ? `Submit is disabled: ${reason}` : '';
    this._envReason.hidden = reason === null;
    this._envReason.textContent = reason
      ? (blocked ? `Submit is disabled: ${reason}` : `Submitting anyway: ${reason}`)
      : '';
    this._envSkipRow.hidden = reason === null;
  }

  /** Whether an environment error blocks Submit (not overridden by "Submit anyway"). */
  private _blocked(): boolean {
    return this._envBlock !== null && !this._envSkip.checked;
  }

  private async _export(): Promise<void> {
    const out = this._envExport;
    out.textContent = 'Exporting…';
    try {
      const res = await exportEnv(this._cluster.value);
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

  private _envSection(): HTMLElement {
    this._envBox = liveBox('jp-HyperPod-env', 'hp-env', { 'aria-busy': 'false' });
    this._envExport = liveBox('jp-HyperPod-env-export', 'hp-env-export');
    const exp = button('hp-env-export-button', 'Export requirements');
    exp.title = "Write this notebook's pinned packages to the cluster's shared storage";
    exp.addEventListener('click', () => void this._export());
    return h(
      'fieldset',
      { class: 'jp-HyperPod-fieldset', 'data-testid': 'hp-env-section' },
      h('legend', {}, 'Environment (notebook vs cluster)'),
      this._envBox,
      exp,
      this._envExport
    );
  }

  /** Set a control by its JobSpec field name (tests and commands use it). */
  setField(field: string, value: string | boolean): void {
    const el = this._fields.get(field) ?? (field === 'cluster' ? this._cluster : undefined);
    if (!el) {
      throw new Error(`no form field ${field}`);
    }
    if (el instanceof HTMLInputElement && el.type === 'checkbox') {
      el.checked = Boolean(value);
    } else {
      el.value = String(value);
    }
  }

  /**
   * Read the node count and the advice inputs and ask for the advice (the owner debounces).
   * An input that cannot be read is shown at once and no advice is asked for.
   */
  updateAdvice(): void {
    const nodes = Number((this._fields.get('nodes') as HTMLInputElement).value.trim());
    const failureRate = this._adviceFields.get('failure_rate')!.value.trim();
    const cost = this._adviceFields.get('checkpoint_cost_s')!.value.trim();
    const step = this._adviceFields.get('step_time_s')!.value.trim();
    let problem: [string, string] | null = null;
    if (!Number.isInteger(nodes) || nodes < 1) {
      problem = ['instances', 'Nodes: give a whole number of at least 1 for the advice'];
    } else if (failureRate === '') {
      problem = ['failure_rate', 'Failure rate: give a fraction per node-hour (0.0004) or a percentage (0.04%)'];
    } else if (cost === '' || !Number.isFinite(Number(cost))) {
      problem = ['checkpoint_cost_s', 'Checkpoint stall: give the seconds one checkpoint blocks training'];
    } else if (step === '' || !Number.isFinite(Number(step))) {
      problem = ['step_time_s', 'Step time: give the seconds per training step'];
    }
    if (problem) {
      this._requestAdvice(null);
      this.showAdvice(null, new HyperPodAPIError(problem[1], 0, 'SpecError', problem[0]), false);
      return;
    }
    this._requestAdvice({
      instances: nodes,
      failureRate,
      checkpointCostS: Number(cost),
      stepTimeS: Number(step)
    });
  }

  /**
   * Show the advice: per recovery mode the recommended checkpoint interval (steps and time)
   * and the projected goodput; or the error, at the input it names.
   */
  showAdvice(
    advice: IGoodputAdvice | null,
    error: HyperPodAPIError | null,
    loading: boolean
  ): void {
    const box = this._advice;
    box.setAttribute('aria-busy', loading ? 'true' : 'false');
    for (const el of this._adviceFields.values()) {
      el.removeAttribute('aria-invalid');
    }
    this._fields.get('nodes')?.removeAttribute('aria-invalid');
    if (loading && !advice && !error) {
      return; // keep what is shown until the answer comes
    }
    box.textContent = '';
    if (error) {
      const el =
        error.field === 'instances'
          ? this._fields.get('nodes')
          : this._adviceFields.get(error.field ?? '');
      el?.setAttribute('aria-invalid', 'true');
      box.appendChild(
        h('div', { class: 'jp-HyperPod-error', 'data-testid': 'hp-advice-error' }, error.message)
      );
      return;
    }
    if (!advice) {
      box.appendChild(h('div', { class: 'jp-HyperPod-dim' }, 'Set the nodes to see the advice.'));
      return;
    }
    box.appendChild(
      h(
        'div',
        { class: 'jp-HyperPod-dim', 'data-testid': 'hp-advice-mtbf', 'data-mtbf-hours': advice.mtbf_hours },
        `${advice.instances} node${advice.instances === 1 ? '' : 's'}: a failure every ` +
          `${duration(advice.mtbf_hours * 3600)} (MTBF), ${fmt(advice.failures_per_day)} a day`
      )
    );
    const body = h('tbody');
    for (const [mode, label] of ADVICE_MODES) {
      const m = advice.modes[mode];
      if (!m) {
        continue;
      }
      body.appendChild(
        h(
          'tr',
          { 'data-testid': 'hp-advice-mode', 'data-mode': mode },
          h('th', { scope: 'row' }, label),
          h(
            'td',
            {
              class: 'jp-mod-number jp-mod-wrap',
              'data-testid': 'hp-advice-interval',
              'data-steps': m.interval_steps,
              'data-seconds': m.interval_s
            },
            `${m.interval_steps} steps (${duration(m.interval_s)})`
          ),
          h(
            'td',
            { class: 'jp-mod-number', 'data-testid': 'hp-advice-goodput', 'data-goodput': m.goodput },
            percent(m.goodput)
          )
        )
      );
    }
    box.appendChild(
      captionedTable(
        'hp-advice-table',
        'Recommended checkpoint interval (Young/Daly) and projected goodput',
        ['Recovery', 'Checkpoint every', 'Goodput'],
        body
      )
    );
    for (const warning of advice.warnings ?? []) {
      box.appendChild(h('div', { class: 'jp-HyperPod-dim', 'data-testid': 'hp-advice-warning' }, warning));
    }
    const cr = advice.modes['checkpoint-restart'];
    if (cr) {
      const apply = button('hp-advice-apply', `Checkpoint every ${cr.interval_steps} steps`);
      apply.title = 'Set "Persistent every" to the checkpoint-restart interval';
      apply.addEventListener('click', () => {
        this.setField('checkpoint.every_steps', String(cr.interval_steps));
      });
      box.appendChild(apply);
    }
  }

  /** Focus the first control. */
  focusFirst(): void {
    this._fields.get('script')?.focus();
  }

  /**
   * Read the form into a request.
   * @throws {Error} naming the field, when a value cannot be read
   */
  read(): ISubmitRequest {
    const text = (f: string) => (this._fields.get(f) as HTMLInputElement).value.trim();
    const num = (f: string): number | null => {
      const v = text(f);
      if (v === '') {
        return null;
      }
      const n = Number(v);
      if (!Number.isInteger(n)) {
        throw new FieldError(f, `${f}: ${JSON.stringify(v)} is not a whole number`);
      }
      return n;
    };
    const req = (f: string): number => {
      const n = num(f);
      if (n === null) {
        throw new FieldError(f, `${f}: give a number`);
      }
      return n;
    };
    const checked = (f: string) => (this._fields.get(f) as HTMLInputElement).checked;
    let args: string[];
    try {
      args = splitArgs(text('args'));
    } catch (e) {
      throw new FieldError('args', (e as Error).message);
    }
    const secretEnv = text('secret_env')
      .split(/[\s,]+/)
      .filter(n => n);
    const badName = secretEnv.find(n => !/^[A-Za-z_][A-Za-z0-9_]*$/.test(n));
    if (badName !== undefined) {
      throw new FieldError('secret_env', `${badName} is not a variable name`);
    }
    const spares = req('resiliency.spares');
    if (spares < 0 || spares > MAX_SPARES) {
      throw new FieldError('resiliency.spares', `Spare nodes: give a whole number from 0 to ${MAX_SPARES}`);
    }
    const stormRestarts = req('resiliency.storm_restarts');
    if (stormRestarts < 1 || stormRestarts > MAX_STORM_RESTARTS) {
      throw new FieldError(
        'resiliency.storm_restarts',
        `Restart-storm guard K: give a whole number from 1 to ${MAX_STORM_RESTARTS}`
      );
    }
    const notebook = this._scriptRadio.checked ? null : this._currentNotebook();
    if (!this._scriptRadio.checked && !notebook) {
      throw new FieldError('script', 'open a notebook (and make it the current tab) to submit it');
    }
    const spec: Partial<IJobSpec> = {
      script: notebook ?? text('script'),
      name: text('name') || 'train',
      cluster: this._cluster.value,
      nodes: req('nodes'),
      procs_per_node: req('procs_per_node'),
      args,
      secret_env: secretEnv,
      resiliency: {
        auto_resume: checked('resiliency.auto_resume'),
        max_retries: req('resiliency.max_retries'),
        health_checks: checked('resiliency.health_checks'),
        spares,
        storm_restarts: stormRestarts
      },
      checkpoint: {
        every_steps: req('checkpoint.every_steps'),
        keep_last: req('checkpoint.keep_last'),
        memory_every_steps: num('checkpoint.memory_every_steps'),
        s3_uri: text('checkpoint.s3_uri') || null,
        s3_every_steps: num('checkpoint.s3_every_steps')
      },
      elastic: {
        min_nodes: num('elastic.min_nodes'),
        max_nodes: num('elastic.max_nodes'),
        global_batch_size: num('elastic.global_batch_size'),
        lr_rule: (this._fields.get('elastic.lr_rule') as HTMLSelectElement)
          .value as IJobSpec['elastic']['lr_rule']
      },
      tensorboard: (this._fields.get('tensorboard') as HTMLSelectElement).value as IJobSpec['tensorboard']
    };
    return { spec, notebook, skipEnvCheck: this._envBlock !== null && this._envSkip.checked };
  }

  /** Validate, submit through the owner, and show any error next to its field. */
  async submit(): Promise<void> {
    this._showError(null, null);
    if (this._blocked()) {
      this._showError(`Submit is disabled: ${this._envBlock}`, null);
      return;
    }
    let req: ISubmitRequest;
    try {
      req = this.read();
    } catch (e) {
      this._showError((e as Error).message, e instanceof FieldError ? e.field : null);
      return;
    }
    this._button.disabled = true;
    this._button.textContent = 'Submitting…';
    try {
      await this._onSubmit(req);
    } catch (e) {
      const field = e instanceof HyperPodAPIError ? e.field : null;
      this._showError((e as Error).message, field);
    } finally {
      this._button.disabled = this._blocked();
      this._button.textContent = 'Submit';
    }
  }

  private _showError(message: string | null, field: string | null): void {
    for (const el of this._fields.values()) {
      el.removeAttribute('aria-invalid');
      el.removeAttribute('aria-describedby');
    }
    this._fieldError?.remove();
    this._fieldError = null;
    this._error.hidden = message === null;
    this._error.textContent = message ?? '';
    if (field) {
      // a SpecError names a field ("checkpoint.every_steps") or a policy ("elastic"): then
      // its first field
      const el =
        this._fields.get(field) ??
        [...this._fields.entries()].find(([k]) => k.startsWith(field + '.'))?.[1];
      if (el) {
        el.setAttribute('aria-invalid', 'true');
        // the message also right below the field it is about
        const row = el.closest('.jp-HyperPod-field');
        if (row && message) {
          const id = uid('hp-field-error');
          this._fieldError = h(
            'div',
            {
              class: 'jp-HyperPod-error jp-HyperPod-fieldError',
              id,
              'data-testid': 'hp-field-error',
              'data-field': el.getAttribute('data-field')
            },
            message
          );
          row.appendChild(this._fieldError);
          el.setAttribute('aria-describedby', id);
        }
        el.focus();
      }
    }
  }

  private _adviceSection(): HTMLElement {
    const input = (
      name: string,
      value: string,
      attrs: { [k: string]: string | number }
    ): HTMLInputElement => {
      const el = h('input', { ...attrs, 'data-advice': name, 'data-testid': `hp-advice-${name}` });
      el.value = value;
      el.addEventListener('input', () => this.updateAdvice());
      this._adviceFields.set(name, el);
      return el;
    };
    const rate = input('failure_rate', '0.04%', { type: 'text', spellcheck: 'false' });
    const cost = input('checkpoint_cost_s', '5', { type: 'number', min: 0, step: 'any' });
    const step = input('step_time_s', '1', { type: 'number', min: 0, step: 'any' });
    this._advice = liveBox('jp-HyperPod-advice', 'hp-advice', { 'aria-busy': 'false' });
    return h(
      'fieldset',
      { class: 'jp-HyperPod-fieldset', 'data-testid': 'hp-advice-section' },
      h('legend', {}, 'Goodput advice (for the nodes above)'),
      this._labelled('Failure rate per node-hour', rate, 'a fraction (0.0004) or a percentage (0.04%)'),
      this._labelled('Checkpoint stall (s)', cost, 'seconds one checkpoint blocks training'),
      this._labelled('Step time (s)', step, 'seconds per training step'),
      this._advice
    );
  }

  private _labelled(label: string, control: Field, hint?: string): HTMLElement {
    const id = uid('hp-field');
    control.id = id;
    return h(
      'div',
      { class: 'jp-HyperPod-field' },
      h('label', { for: id }, label),
      control,
      hint ? h('span', { class: 'jp-HyperPod-hint' }, hint) : null
    );
  }

  private _text(field: string, label: string, value: string, placeholder?: string): HTMLElement {
    const input = h('input', {
      type: 'text',
      value,
      placeholder,
      'data-field': field,
      'data-testid': `hp-field-${field}`,
      spellcheck: 'false'
    });
    input.value = value;
    this._fields.set(field, input);
    return this._labelled(label, input);
  }

  private _number(
    field: string,
    label: string,
    value: number | null,
    min: number,
    placeholder?: string,
    max?: number,
    hint?: string
  ): HTMLElement {
    const input = h('input', {
      type: 'number',
      min,
      max,
      step: 1,
      placeholder,
      'data-field': field,
      'data-testid': `hp-field-${field}`
    });
    input.value = value === null ? '' : String(value);
    this._fields.set(field, input);
    return this._labelled(label, input, hint);
  }

  private _check(field: string, label: string, value: boolean): HTMLElement {
    const input = h('input', {
      type: 'checkbox',
      'data-field': field,
      'data-testid': `hp-field-${field}`
    });
    input.checked = value;
    this._fields.set(field, input);
    return h('div', { class: 'jp-HyperPod-field jp-HyperPod-check' }, h('label', {}, input, ' ', label));
  }

  private _envBox!: HTMLDivElement;
  private _envExport!: HTMLDivElement;
  private _envReason: HTMLDivElement;
  private _envBlock: string | null = null;
  private _envSkip!: HTMLInputElement;
  private _envSkipRow!: HTMLElement;
  private _invalidShown = false;
  private _fieldError: HTMLDivElement | null = null;
  private _envSeq = 0;
  private _envKey = '';
  private _envTimer = 0;
  private _onSubmit: (req: ISubmitRequest) => Promise<void>;
  private _currentNotebook: () => string | null;
  private _requestAdvice: (query: IAdviceQuery | null) => void;
  private _adviceFields = new Map<string, HTMLInputElement>();
  private _advice!: HTMLDivElement;
  private _fields = new Map<string, Field>();
  private _cluster: HTMLSelectElement;
  private _scriptRadio: HTMLInputElement;
  private _error: HTMLDivElement;
  private _button: HTMLButtonElement;
}

/** A form value that cannot be read; `field` is the JobSpec field. */
class FieldError extends Error {
  constructor(
    readonly field: string,
    message: string
  ) {
    super(message);
  }
}
