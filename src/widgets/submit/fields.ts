/**
 * The submit form's controls: labelled rows, and the map of the controls by the JobSpec field
 * they set, with a builder per kind of control.
 */
import { h, uid } from '../dom';

/** A control of the form. */
export type Field = HTMLInputElement | HTMLSelectElement;

/** A form value that cannot be read; `field` is the JobSpec field. */
export class FieldError extends Error {
  constructor(
    readonly field: string,
    message: string
  ) {
    super(message);
  }
}

/** A `jp-HyperPod-field` row: `label` for `control` (given a fresh id), then `hint` if any. */
export function labelled(label: string, control: Field, hint?: string): HTMLElement {
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

/**
 * The form's controls by the JobSpec field they set (dotted for policies), in the order they
 * were added. Each builder makes a control carrying `data-field` = its field and the test id
 * `hp-field-<field>`, adds it, and returns its row.
 */
export class FormFields extends Map<string, Field> {
  /** A text input. */
  text(field: string, label: string, value: string, placeholder?: string): HTMLElement {
    const input = h('input', {
      type: 'text',
      value,
      placeholder,
      'data-field': field,
      'data-testid': `hp-field-${field}`,
      spellcheck: 'false'
    });
    input.value = value;
    this.set(field, input);
    return labelled(label, input);
  }

  /** A whole-number input from `min` (to `max`); `value` null leaves it empty. */
  number(
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
    this.set(field, input);
    return labelled(label, input, hint);
  }

  /** A checkbox, its label after it. */
  check(field: string, label: string, value: boolean): HTMLElement {
    const input = h('input', {
      type: 'checkbox',
      'data-field': field,
      'data-testid': `hp-field-${field}`
    });
    input.checked = value;
    this.set(field, input);
    return h('div', { class: 'jp-HyperPod-field jp-HyperPod-check' }, h('label', {}, input, ' ', label));
  }
}
