/** The event stream of one job: a WebSocket that reconnects from its last cursor. */
import { ISignal, Signal } from '@lumino/signaling';

import * as api from '../api/network';
import { IJobEvent } from '../api/events';
import { IJobView, StreamMessage } from '../api/rest';
import { IJobStreamModel } from './tokens';

/** Reconnect delays of the event stream, milliseconds (the last repeats). */
const RECONNECT_MS = [500, 1000, 2000, 5000];

/**
 * The events of one job (the selected one), over `WS hyperpod/jobs/{id}/stream`. On a drop it
 * reconnects from the last cursor it saw, after a growing delay, so no event is shown twice or
 * lost; it stops once the server said the job ended.
 */
export class JobStreamModel implements IJobStreamModel {
  /** The streamed job's id, or null. */
  get jobId(): string | null {
    return this._jobId;
  }
  /** Events of the streamed job, in arrival order, each once. */
  get events(): IJobEvent[] {
    return this._events;
  }
  /** The stream cursor after the last event received (opaque), or null. */
  get cursor(): string | null {
    return this._cursor;
  }
  /** Whether the server said the job ended and sent all its events. */
  get ended(): boolean {
    return this._ended;
  }
  /** Another job (or none) is streamed; `events` was reset. */
  get jobChanged(): ISignal<this, void> {
    return this._jobChanged;
  }
  /** New events arrived (the new ones). */
  get eventsAdded(): ISignal<this, IJobEvent[]> {
    return this._eventsAdded;
  }
  /** The server sent the streamed job's view (its status or its progress counts changed). */
  get statusReceived(): ISignal<this, IJobView> {
    return this._statusReceived;
  }
  /** The server sent every event of the ended job. */
  get endReceived(): ISignal<this, void> {
    return this._endReceived;
  }

  /** Stream the events of `jobId` (null: none), from its first event. */
  open(jobId: string | null): void {
    if (jobId === this._jobId) {
      return;
    }
    this._close();
    this._jobId = jobId;
    this._events = [];
    this._seen.clear();
    this._cursor = null;
    this._ended = false;
    this._jobChanged.emit();
    if (jobId) {
      this._connect();
    }
  }

  /** Close the stream, disconnect the listeners. */
  dispose(): void {
    this._disposed = true;
    this._close();
    Signal.clearData(this);
  }

  private _connect(): void {
    const jobId = this._jobId;
    if (!jobId || this._disposed) {
      return;
    }
    const ws = api.openEventStream(jobId, this._cursor, msg => this._onMessage(jobId, msg));
    ws.onopen = () => {
      this._attempt = 0;
    };
    ws.onclose = () => {
      if (this._ws !== ws) {
        return;
      }
      this._ws = null;
      if (this._ended) {
        return; // the server sent everything of a finished job
      }
      const delay = RECONNECT_MS[Math.min(this._attempt, RECONNECT_MS.length - 1)];
      this._attempt++;
      this._reconnect = window.setTimeout(() => {
        this._reconnect = null;
        if (this._jobId === jobId && !this._ws) {
          this._connect();
        }
      }, delay);
    };
    this._ws = ws;
  }

  private _close(): void {
    if (this._reconnect !== null) {
      window.clearTimeout(this._reconnect);
      this._reconnect = null;
    }
    const ws = this._ws;
    this._ws = null;
    if (ws) {
      ws.onclose = null;
      ws.close();
    }
    this._attempt = 0;
  }

  private _onMessage(jobId: string, msg: StreamMessage): void {
    if (jobId !== this._jobId) {
      return;
    }
    if (msg.type === 'event') {
      const ev = msg.event;
      this._cursor = msg.cursor;
      const key = `${ev.writer}\u0000${ev.seq}`;
      if (this._seen.has(key)) {
        return;
      }
      this._seen.add(key);
      this._events.push(ev);
      this._eventsAdded.emit([ev]);
    } else if (msg.type === 'status') {
      this._statusReceived.emit(msg.job);
    } else if (msg.type === 'end') {
      this._ended = true;
      this._endReceived.emit();
    }
  }

  private _jobId: string | null = null;
  private _events: IJobEvent[] = [];
  private _seen = new Set<string>();
  private _cursor: string | null = null;
  private _ended = false;
  private _ws: WebSocket | null = null;
  private _attempt = 0;
  private _reconnect: number | null = null;
  private _disposed = false;
  private _jobChanged = new Signal<this, void>(this);
  private _eventsAdded = new Signal<this, IJobEvent[]>(this);
  private _statusReceived = new Signal<this, IJobView>(this);
  private _endReceived = new Signal<this, void>(this);
}
