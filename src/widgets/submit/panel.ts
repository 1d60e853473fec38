/**
 * The submit form as a main-area page: a header naming what it submits (a notebook, or a
 * script under the Lab root) above the form, its own goodput advice, and the clusters of the
 * panel state kept current.
 */
import { Message } from '@lumino/messaging';
import { Widget } from '@lumino/widgets';

import { IJobView } from '../../api/rest';
import { AdviceModel } from '../../models/advice';
import { IHyperPodModel } from '../../models/tokens';
import { h } from '../dom';
import { SubmitForm } from './form';

/** The submit page of one notebook (or of a script, without one). */
export class SubmitPanel extends Widget {
  /**
   * @param options.model - the panel state: clusters, and `submit` (which selects the new job)
   * @param options.notebook - the path of the notebook this page submits (server root
   *   relative), or null: the page submits a script path
   * @param options.saveNotebook - save the notebook at `path` if it has unsaved changes (the
   *   server reads the file)
   * @param options.onSubmitted - called with the job after a submission was accepted
   */
  constructor(options: {
    model: IHyperPodModel;
    notebook: () => string | null;
    saveNotebook: (path: string) => Promise<void>;
    onSubmitted?: (job: IJobView) => void;
  }) {
    super();
    this._model = options.model;
    this._notebook = options.notebook;
    this.addClass('jp-HyperPodSubmit');
    this.node.setAttribute('data-testid', 'hp-submit-page');
    // one advice per page: two open pages with other node counts each show their own
    const advice = this._advice;
    this.form = new SubmitForm({
      currentNotebook: options.notebook,
      source: options.notebook() ? 'notebook' : 'script',
      requestAdvice: query => advice.request(query),
      onSubmit: async req => {
        if (req.notebook) {
          await options.saveNotebook(req.notebook);
        }
        const job = await this._model.submit(req.spec, req.notebook, { skipEnvCheck: req.skipEnvCheck });
        this.form.showSubmitted(job.job_id);
        options.onSubmitted?.(job);
      }
    });
    advice.changed.connect(() => this.form.showAdvice(advice.advice, advice.error, advice.loading), this);
    this._subtitle = h('div', { class: 'jp-HyperPodSubmit-subtitle', 'data-testid': 'hp-submit-subtitle' });
    this.node.append(
      h(
        'header',
        { class: 'jp-HyperPodSubmit-header' },
        h('h2', { class: 'jp-HyperPodSubmit-title' }, 'Submit to cluster'),
        this._subtitle
      ),
      this.form.node
    );
    this._model.clusters.changed.connect(this._onClusters, this);
    this._onClusters();
    this.updateSubtitle();
  }

  /** The form. */
  readonly form: SubmitForm;

  /** The path this page submits, or null (a script). */
  get notebook(): string | null {
    return this._notebook();
  }

  /** Say again what the page submits (after a rename of its notebook). */
  updateSubtitle(): void {
    const path = this._notebook();
    this._subtitle.textContent = path
      ? `Notebook ${path}, saved and run on the cluster as a script`
      : 'A script under the Lab root (open this form from a notebook to submit the notebook)';
  }

  override dispose(): void {
    if (this.isDisposed) {
      return;
    }
    this._model.clusters.changed.disconnect(this._onClusters, this);
    this._advice.dispose();
    this.form.dispose();
    super.dispose();
  }

  protected override onAfterAttach(msg: Message): void {
    super.onAfterAttach(msg);
    // the goodput advice for the default inputs, once the page is shown
    this.form.updateAdvice();
  }

  protected override onActivateRequest(msg: Message): void {
    super.onActivateRequest(msg);
    if (!this.node.contains(document.activeElement)) {
      this.form.focusFirst();
    }
  }

  private _onClusters(): void {
    this.form.setClusters(this._model.clusters.clusters);
  }

  private _model: IHyperPodModel;
  private _notebook: () => string | null;
  private _advice = new AdviceModel();
  private _subtitle: HTMLDivElement;
}
