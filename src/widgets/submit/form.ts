/**
 * The submit form: a script path or the current notebook, placement and the three policies, in
 * three sections with the environment check and the goodput advice beside them. Its parts: `fields.ts` (the controls), `spec.ts` (reading them into a JobSpec), `env.ts`
 * (the environment check) and `advice.ts` (the goodput advice).
 */
import { Widget } from '@lumino/widgets';

import { HyperPodAPIError } from '../../api/errors';
import { IAdviceQuery, ICluster, IEnvDiff, IGoodputAdvice } from '../../api/rest';
import { button, errorBox, h, uid } from '../dom';
import { AdviceSection } from './advice';
import { EnvCheck } from './env';
import { Field, FieldError, FormFields, labelled } from './fields';
import { ISubmitRequest, MAX_SPARES, MAX_STORM_RESTARTS, readSpec, TENSORBOARD_MODES } from './spec';

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
    /** The source chosen at first (default `script`). */
    source?: 'script' | 'notebook';
  }) {
    super({ node: document.createElement('form') });
    this._onSubmit = options.onSubmit;
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
    this._notebookRadio = nbRadio;
    this._notebookPath = h('span', { class: 'jp-HyperPod-dim jp-HyperPod-sourcePath', 'data-testid': 'hp-source-notebook-path' });
    if (options.source === 'notebook') {
      nbRadio.checked = true;
    }
    const source = h(
      'fieldset',
      { class: 'jp-HyperPod-fieldset' },
      h('legend', {}, 'What to run'),
      h(
        'div',
        { class: 'jp-HyperPod-sourceRow' },
        h('label', { class: 'jp-HyperPod-radio' }, scriptRadio, ' Script'),
        h('label', { class: 'jp-HyperPod-radio' }, nbRadio, ' Current notebook'),
        this._notebookPath
      ),
      this._fields.text('script', 'Script path', 'examples/train_lm.py', 'path relative to the Lab root'),
      this._fields.text('args', 'Script arguments', '', 'e.g. --steps 100 --lr 3e-3')
    );
    this._cluster = h('select', { 'data-field': 'cluster', 'data-testid': 'hp-field-cluster' });
    const placement = h(
      'fieldset',
      { class: 'jp-HyperPod-fieldset' },
      h('legend', {}, 'Placement'),
      this._fields.text('name', 'Job name', 'train'),
      labelled('Cluster', this._cluster),
      this._fields.number('nodes', 'Nodes', 1, 1),
      this._fields.number('procs_per_node', 'Processes per node', 1, 1)
    );
    this._fields.get('nodes')!.addEventListener('input', () => this.updateAdvice());
    const lr = h('select', { 'data-field': 'elastic.lr_rule' });
    for (const rule of ['linear', 'sqrt', 'none']) {
      lr.appendChild(h('option', { value: rule }, rule));
    }
    const elastic = h(
      'fieldset',
      { class: 'jp-HyperPod-fieldset' },
      h('legend', {}, 'Elastic (nodes)'),
      this._fields.number('elastic.min_nodes', 'Min nodes', null, 1, 'fixed size'),
      this._fields.number('elastic.max_nodes', 'Max nodes', null, 1, 'fixed size'),
      this._fields.number('elastic.global_batch_size', 'Global batch size', null, 1, 'script decides'),
      labelled('LR rule', lr)
    );
    // after the bounds: an error naming the policy ("elastic") points at its first field
    this._fields.set('elastic.lr_rule', lr);
    const resiliency = h(
      'fieldset',
      { class: 'jp-HyperPod-fieldset' },
      h('legend', {}, 'Resiliency'),
      this._fields.check('resiliency.auto_resume', 'Auto-resume after a failure', true),
      this._fields.number('resiliency.max_retries', 'Max retries', 3, 0),
      this._fields.number('resiliency.spares', 'Spare nodes', 0, 0, undefined, MAX_SPARES),
      this._fields.number(
        'resiliency.storm_restarts',
        'Restart-storm guard K',
        3,
        1,
        undefined,
        MAX_STORM_RESTARTS,
        `stop after K restarts in a row without progress (1 to ${MAX_STORM_RESTARTS})`
      ),
      this._fields.check('resiliency.health_checks', 'Node health checks', true)
    );
    const checkpoints = h(
      'fieldset',
      { class: 'jp-HyperPod-fieldset' },
      h('legend', {}, 'Checkpoints (intervals in steps)'),
      this._fields.number('checkpoint.every_steps', 'Persistent every', 20, 1),
      this._fields.number('checkpoint.keep_last', 'Keep last', 2, 1),
      this._fields.number('checkpoint.memory_every_steps', 'Memory tier every', null, 1, 'off'),
      this._fields.text('checkpoint.s3_uri', 'S3 tier URI', '', 's3://bucket/prefix'),
      this._fields.number('checkpoint.s3_every_steps', 'S3 tier every', null, 1, 'off')
    );
    const tensorboard = h('select', { 'data-field': 'tensorboard', 'data-testid': 'hp-field-tensorboard' });
    for (const [mode, label] of TENSORBOARD_MODES) {
      tensorboard.appendChild(h('option', { value: mode }, label));
    }
    const secrets = h(
      'div',
      { class: 'jp-HyperPod-fieldset jp-mod-plain' },
      this._fields.text(
        'secret_env',
        'Secret variables',
        '',
        "names, e.g. HF_TOKEN: values come from the server's environment and are never written"
      ),
      labelled(
        'TensorBoard',
        tensorboard,
        'step metrics as event files in the job directory (tensorboard/)'
      )
    );
    this._fields.set('tensorboard', tensorboard);
    this._env = new EnvCheck({
      cluster: () => this._cluster.value,
      script: () => this._envScript(),
      onBlockChanged: () => this._updateButton()
    });
    this._cluster.addEventListener('change', () => this.updateEnv());
    this._fields.get('script')!.addEventListener('input', () => this.updateEnv());
    // the script path is for a script: off while the notebook is the source
    const onSource = () => {
      (this._fields.get('script') as HTMLInputElement).disabled = nbRadio.checked;
      this.updateEnv();
    };
    scriptRadio.addEventListener('change', onSource);
    nbRadio.addEventListener('change', onSource);
    (this._fields.get('script') as HTMLInputElement).disabled = nbRadio.checked;
    // the current notebook may change (a rename, or the active tab in a form that follows it):
    // look again when the form is used
    form.addEventListener('focusin', () => {
      this._showNotebookPath();
      this._env.updateIfChanged();
    });
    this._advice = new AdviceSection({
      nodes: this._fields.get('nodes') as HTMLInputElement,
      request: options.requestAdvice ?? (() => undefined),
      setField: (field, value) => this.setField(field, value)
    });
    // the fields in three sections; the environment check and the goodput advice beside them
    // (a second column on a wide form, below the fields on a narrow one: style/submit.css)
    const section = (title: string, testid: string, ...parts: HTMLElement[]) =>
      h(
        'section',
        { class: 'jp-HyperPod-formSection', 'data-testid': testid, 'aria-label': title },
        h('h3', { class: 'jp-HyperPod-formSectionTitle' }, title),
        h('div', { class: 'jp-HyperPod-formSectionBody' }, ...parts)
      );
    this._error = errorBox('hp-submit-error');
    this._done = h('div', { class: 'jp-HyperPod-submitDone', 'data-testid': 'hp-submit-done', role: 'status' });
    this._done.hidden = true;
    this._button = button('hp-submit', 'Submit', { type: 'submit', class: 'jp-HyperPod-button jp-mod-accept' });
    form.append(
      h(
        'div',
        { class: 'jp-HyperPod-formColumns' },
        h(
          'div',
          { class: 'jp-HyperPod-formMain' },
          section('Cluster & resources', 'hp-section-cluster', source, placement, elastic),
          section('Resiliency & checkpoints', 'hp-section-resiliency', resiliency, checkpoints),
          section('Secrets & metrics', 'hp-section-secrets', secrets)
        ),
        h(
          'aside',
          { class: 'jp-HyperPod-formAside', 'aria-label': 'Environment check and goodput advice' },
          this._env.section,
          this._advice.node
        )
      ),
      h(
        'div',
        { class: 'jp-HyperPod-formFooter' },
        this._env.reasonBox,
        this._env.skipRow,
        this._error,
        this._done,
        this._button
      )
    );
    this._showNotebookPath();
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
   * last request wins) and show it. An error-level difference disables Submit with the reason.
   */
  updateEnv(delayMs = 400): void {
    this._env.update(delayMs);
  }

  /** Show an environment diff (or why there is none) and block Submit on an error. */
  showEnv(diff: IEnvDiff | null, error: HyperPodAPIError | null): void {
    this._env.show(diff, error);
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
    this._advice.update();
  }

  /**
   * Show the advice: per recovery mode the recommended checkpoint interval (steps and time)
   * and the projected goodput; or the error, at the input it names.
   */
  showAdvice(advice: IGoodputAdvice | null, error: HyperPodAPIError | null, loading: boolean): void {
    this._advice.show(advice, error, loading);
  }

  /** Focus the first control: the script path, or the first choice when a notebook is the source. */
  focusFirst(): void {
    (this._scriptRadio.checked ? this._fields.get('script') : this._notebookRadio)?.focus();
  }

  /** Say that `jobId` was submitted (cleared by the next attempt). */
  showSubmitted(jobId: string): void {
    this._done.hidden = false;
    this._done.textContent = `Submitted ${jobId}: it is selected in the HyperPod sidebar.`;
  }

  /**
   * Read the form into a request.
   * @throws {Error} naming the field, when a value cannot be read
   */
  read(): ISubmitRequest {
    const { spec, notebook } = readSpec(this._fields, {
      cluster: this._cluster.value,
      fromNotebook: !this._scriptRadio.checked,
      currentNotebook: () => this._currentNotebook()
    });
    return { spec, notebook, skipEnvCheck: this._env.skipped };
  }

  /** Validate, submit through the owner, and show any error next to its field. */
  async submit(): Promise<void> {
    this._showError(null, null);
    this._done.hidden = true;
    if (this._env.blocked) {
      this._showError(`Submit is disabled: ${this._env.block}`, null);
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
      this._button.disabled = this._env.blocked;
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

  /** Show the current notebook's path beside its choice; without one the choice is disabled. */
  private _showNotebookPath(): void {
    const path = this._currentNotebook();
    this._notebookPath.textContent = path ?? '(open the form from a notebook to submit it)';
    this._notebookRadio.disabled = path === null && !this._notebookRadio.checked;
  }

  /** The script or notebook whose environment is compared, or null. */
  private _envScript(): string | null {
    if (!this._scriptRadio.checked) {
      return this._currentNotebook();
    }
    return (this._fields.get('script') as HTMLInputElement).value.trim() || null;
  }

  /** Disable Submit while an environment error blocks it, saying why. */
  private _updateButton(): void {
    const blocked = this._env.blocked;
    this._button.disabled = blocked;
    this._button.title = blocked ? `Submit is disabled: ${this._env.block}` : '';
  }

  private _env: EnvCheck;
  private _advice: AdviceSection;
  private _invalidShown = false;
  private _fieldError: HTMLDivElement | null = null;
  private _onSubmit: (req: ISubmitRequest) => Promise<void>;
  private _currentNotebook: () => string | null;
  private _fields = new FormFields();
  private _cluster: HTMLSelectElement;
  private _scriptRadio: HTMLInputElement;
  private _notebookRadio: HTMLInputElement;
  private _notebookPath: HTMLSpanElement;
  private _done: HTMLDivElement;
  private _error: HTMLDivElement;
  private _button: HTMLButtonElement;
}
