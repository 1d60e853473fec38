/**
 * The submit pages in the main area: at most one tab per notebook (and one for a script, opened
 * without a notebook), reused while it is open.
 */
import { MainAreaWidget } from '@jupyterlab/apputils';
import { LabIcon } from '@jupyterlab/ui-components';
import { ISignal } from '@lumino/signaling';
import { Widget } from '@lumino/widgets';

import { IJobView } from '../../api/rest';
import { IHyperPodModel } from '../../models/tokens';
import { SubmitPanel } from './panel';

/** What the tabs need of a notebook's document widget (duck-typed: no notebook package needed). */
export type NotebookWidget = Widget & {
  context: { path: string; pathChanged?: ISignal<unknown, string> };
};

/** The last part of a path. */
function basename(path: string): string {
  return path.split('/').pop() || path;
}

/** What the submit tabs need of the Lab. */
export interface ISubmitTabsOptions {
  /** The panel state the pages submit through. */
  model: IHyperPodModel;
  /** Add a widget to the main area. */
  addToMain: (widget: Widget) => void;
  /** Activate a widget by its id. */
  activate: (id: string) => void;
  /** Save the notebook at `path` if it has unsaved changes (the server reads the file). */
  saveNotebook: (path: string) => Promise<void>;
  /** The tabs' icon. */
  icon: LabIcon;
  /** Called with each job a page submitted. */
  onSubmitted?: (job: IJobView) => void;
}

/** Opens and reuses the submit tabs. */
export class SubmitTabs {
  constructor(options: ISubmitTabsOptions) {
    this._options = options;
  }

  /** Whether `widget` is one of the submit tabs. */
  owns(widget: Widget | null): boolean {
    return widget !== null && [...this._tabs.values()].includes(widget as MainAreaWidget<SubmitPanel>);
  }

  /**
   * Open the submit tab of `notebook` (null: the script form), or activate it when open.
   * @returns the tab (a `MainAreaWidget` whose content is the `SubmitPanel`)
   */
  open(notebook: NotebookWidget | null): MainAreaWidget<SubmitPanel> {
    let tab = this._tabs.get(notebook);
    if (!tab || tab.isDisposed) {
      tab = this._create(notebook);
    }
    this._options.activate(tab.id);
    return tab;
  }

  private _create(notebook: NotebookWidget | null): MainAreaWidget<SubmitPanel> {
    const { model, saveNotebook, onSubmitted, icon } = this._options;
    // a closed notebook's page keeps the path it had: the file is still there to submit
    let lastPath = notebook?.context.path ?? null;
    const path = () => {
      if (notebook && !notebook.isDisposed) {
        lastPath = notebook.context.path;
      }
      return lastPath;
    };
    const content = new SubmitPanel({ model, notebook: path, saveNotebook, onSubmitted });
    const tab = new MainAreaWidget({ content });
    tab.id = `hp-submit-tab-${++this._count}`;
    tab.addClass('jp-HyperPodSubmit-tab');
    tab.title.icon = icon;
    tab.title.closable = true;
    const retitle = () => {
      const p = path();
      tab.title.label = p ? `Submit ${basename(p)}` : 'Submit a job';
      tab.title.caption = p ? `Submit ${p} to a HyperPod cluster` : 'Submit a script to a HyperPod cluster';
      content.updateSubtitle();
    };
    retitle();
    notebook?.context.pathChanged?.connect(retitle);
    this._tabs.set(notebook, tab);
    tab.disposed.connect(() => {
      notebook?.context.pathChanged?.disconnect(retitle);
      if (this._tabs.get(notebook) === tab) {
        this._tabs.delete(notebook);
      }
    });
    this._options.addToMain(tab);
    return tab;
  }

  private _options: ISubmitTabsOptions;
  private _tabs = new Map<NotebookWidget | null, MainAreaWidget<SubmitPanel>>();
  private _count = 0;
}
