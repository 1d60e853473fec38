/**
 * The submit form's goodput advice (`GET goodput/advice`): the failure rate, checkpoint stall
 * and step time inputs, and per recovery mode the recommended checkpoint interval and the
 * projected goodput for the form's node count.
 */
import { HyperPodAPIError } from '../../api/errors';
import { IAdviceQuery, IGoodputAdvice } from '../../api/rest';
import { button, captionedTable, duration, fmt, h, liveBox, percent } from '../dom';
import { labelled } from './fields';

/** The recovery modes of the advice, in display order, with their labels. */
const ADVICE_MODES: [string, string][] = [
  ['checkpoint-restart', 'Checkpoint-restart'],
  ['checkpointless', 'Checkpointless']
];

/** The advice fieldset of the form; its owner asks for the advice and shows the answer. */
export class AdviceSection {
  /**
   * @param options.nodes - the form's node count, the advice's instances
   * @param options.request - ask for the advice (debounced by the owner); null: the inputs are
   *   not usable
   * @param options.setField - set a field of the form (the interval to a checkpoint field)
   */
  constructor(options: {
    nodes: HTMLInputElement;
    request: (query: IAdviceQuery | null) => void;
    setField: (field: string, value: string) => void;
  }) {
    this._nodes = options.nodes;
    this._request = options.request;
    this._setField = options.setField;
    const input = (
      name: string,
      value: string,
      attrs: { [k: string]: string | number }
    ): HTMLInputElement => {
      const el = h('input', { ...attrs, 'data-advice': name, 'data-testid': `hp-advice-${name}` });
      el.value = value;
      el.addEventListener('input', () => this.update());
      this._inputs.set(name, el);
      return el;
    };
    const rate = input('failure_rate', '0.04%', { type: 'text', spellcheck: 'false' });
    const cost = input('checkpoint_cost_s', '5', { type: 'number', min: 0, step: 'any' });
    const step = input('step_time_s', '1', { type: 'number', min: 0, step: 'any' });
    this._box = liveBox('jp-HyperPod-advice', 'hp-advice', { 'aria-busy': 'false' });
    this.node = h(
      'fieldset',
      { class: 'jp-HyperPod-fieldset', 'data-testid': 'hp-advice-section' },
      h('legend', {}, 'Goodput advice (for the nodes above)'),
      labelled('Failure rate per node-hour', rate, 'a fraction (0.0004) or a percentage (0.04%)'),
      labelled('Checkpoint stall (s)', cost, 'seconds one checkpoint blocks training'),
      labelled('Step time (s)', step, 'seconds per training step'),
      this._box
    );
  }

  /** The fieldset: the inputs and the advice. */
  readonly node: HTMLElement;

  /**
   * Read the node count and the advice inputs and ask for the advice (the owner debounces).
   * An input that cannot be read is shown at once and no advice is asked for.
   */
  update(): void {
    const nodes = Number(this._nodes.value.trim());
    const failureRate = this._inputs.get('failure_rate')!.value.trim();
    const cost = this._inputs.get('checkpoint_cost_s')!.value.trim();
    const step = this._inputs.get('step_time_s')!.value.trim();
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
      this._request(null);
      this.show(null, new HyperPodAPIError(problem[1], 0, 'SpecError', problem[0]), false);
      return;
    }
    this._request({
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
  show(
    advice: IGoodputAdvice | null,
    error: HyperPodAPIError | null,
    loading: boolean
  ): void {
    const box = this._box;
    box.setAttribute('aria-busy', loading ? 'true' : 'false');
    for (const el of this._inputs.values()) {
      el.removeAttribute('aria-invalid');
    }
    this._nodes.removeAttribute('aria-invalid');
    if (loading && !advice && !error) {
      return; // keep what is shown until the answer comes
    }
    box.textContent = '';
    if (error) {
      const el =
        error.field === 'instances'
          ? this._nodes
          : this._inputs.get(error.field ?? '');
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
        this._setField('checkpoint.every_steps', String(cr.interval_steps));
      });
      box.appendChild(apply);
    }
  }

  private _nodes: HTMLInputElement;
  private _request: (query: IAdviceQuery | null) => void;
  private _setField: (field: string, value: string) => void;
  private _inputs = new Map<string, HTMLInputElement>();
  private _box: HTMLDivElement;
}
