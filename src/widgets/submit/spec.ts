/**
 * The JobSpec side of the submit form: the limits and modes of the JobSpec fields it offers,
 * the request it hands its owner, and reading its fields into that request.
 */
import { IJobSpec } from '../../api/rest';
import { splitArgs } from './args';
import { FieldError, FormFields } from './fields';

/** Most spare nodes a JobSpec takes (`hyperpod_lab.spec.MAX_SPARES`). */
export const MAX_SPARES = 64;

/** Largest restart-storm guard K a JobSpec takes (`hyperpod_lab.spec.MAX_STORM_RESTARTS`). */
export const MAX_STORM_RESTARTS = 1000;

/** The TensorBoard modes of a JobSpec (`hyperpod_lab.spec.TENSORBOARD_MODES`), with their labels. */
export const TENSORBOARD_MODES: [NonNullable<IJobSpec['tensorboard']>, string][] = [
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
 * Read the form's fields into the JobSpec fields the user set and the notebook to submit.
 *
 * @param source.cluster - the chosen cluster profile
 * @param source.fromNotebook - the source is the current notebook, not the script path
 * @param source.currentNotebook - the current notebook's path, or null when there is none
 * @throws {FieldError} naming the field, when a value cannot be read
 */
export function readSpec(
  fields: FormFields,
  source: { cluster: string; fromNotebook: boolean; currentNotebook: () => string | null }
): Omit<ISubmitRequest, 'skipEnvCheck'> {
  const text = (f: string) => (fields.get(f) as HTMLInputElement).value.trim();
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
  const checked = (f: string) => (fields.get(f) as HTMLInputElement).checked;
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
  const notebook = source.fromNotebook ? source.currentNotebook() : null;
  if (source.fromNotebook && !notebook) {
    throw new FieldError('script', 'open a notebook (and make it the current tab) to submit it');
  }
  const spec: Partial<IJobSpec> = {
    script: notebook ?? text('script'),
    name: text('name') || 'train',
    cluster: source.cluster,
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
      lr_rule: (fields.get('elastic.lr_rule') as HTMLSelectElement)
        .value as IJobSpec['elastic']['lr_rule']
    },
    tensorboard: (fields.get('tensorboard') as HTMLSelectElement).value as IJobSpec['tensorboard']
  };
  return { spec, notebook };
}
