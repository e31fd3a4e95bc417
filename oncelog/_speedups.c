/* oncelog._speedups: the JSON-lines decode hot path in C (optional).
 *
 * decode_json_lines() turns the complete lines of a buffer into Envelopes of
 * JSONMessages, exactly as oncelog.framing.jsonlines does in Python, and parses
 * each canonical UUID string into the envelope's cached (producer, clock, flags).
 * It stops at the first line it cannot decode cleanly (bad JSON, not an object)
 * and reports where: the Python path takes over from there and raises the error
 * with its journal and offsets. Anything unusual about a UUID (missing, not a
 * canonical lower/upper-case hex string) is left for Envelope to parse lazily.
 *
 * Instances are built by allocating the (slots-only) Python classes and storing
 * into their slots through the offsets of their member descriptors, which
 * configure() looks up and checks once.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <string.h>

typedef struct {
    PyTypeObject *type;
    Py_ssize_t off[5];
    int n;
} SlotClass;

static SlotClass envelope_cls = {NULL, {0}, 0}; /* journal, begin, end, message, _ids */
static SlotClass message_cls = {NULL, {0}, 0};  /* doc, uuid_field */
static PyObject *loads_func = NULL;
static PyObject *flag_values = NULL; /* tuple: flags value -> Flags member or int */
static PyObject *nil_fields = NULL;  /* the ids of a message with no UUID */
static PyObject *value_error = NULL;

/* Producer IDs: one shared bytes object per node value (a small direct-mapped cache). */
#define PRODUCER_CACHE 1024
static unsigned long long cache_node[PRODUCER_CACHE];
static PyObject *cache_bytes[PRODUCER_CACHE];

/* The offsets of the object slots `names` of the slots-only class `cls` into `off`. */
static int
slot_offsets(PyObject *cls, const char *const *names, int n, Py_ssize_t *off)
{
    if (!PyType_Check(cls)) {
        PyErr_SetString(PyExc_TypeError, "configure() needs classes");
        return -1;
    }
    PyTypeObject *type = (PyTypeObject *)cls;
    if (type->tp_dictoffset != 0) {
        PyErr_Format(PyExc_TypeError, "%s must have __slots__ and no __dict__", type->tp_name);
        return -1;
    }
    for (int i = 0; i < n; i++) {
        PyObject *descr = PyObject_GetAttrString(cls, names[i]);
        if (descr == NULL)
            return -1;
        if (!Py_IS_TYPE(descr, &PyMemberDescr_Type)) {
            Py_DECREF(descr);
            PyErr_Format(PyExc_TypeError, "%s.%s is not a slot", type->tp_name, names[i]);
            return -1;
        }
        PyMemberDef *member = ((PyMemberDescrObject *)descr)->d_member;
        if (member->type != T_OBJECT_EX || (member->flags & READONLY)) {
            Py_DECREF(descr);
            PyErr_Format(PyExc_TypeError, "%s.%s is not a writable object slot",
                         type->tp_name, names[i]);
            return -1;
        }
        off[i] = member->offset;
        Py_DECREF(descr);
    }
    return 0;
}

/* A SlotClass for `cls`, set only once every name is found to be a slot. */
static int
slot_class(PyObject *cls, const char *const *names, int n, SlotClass *out)
{
    Py_ssize_t off[5] = {0};
    if (slot_offsets(cls, names, n, off) < 0)
        return -1;
    memcpy(out->off, off, sizeof off);
    out->n = n;
    Py_XSETREF(out->type, (PyTypeObject *)Py_NewRef(cls));
    return 0;
}

static PyObject *
configure(PyObject *self, PyObject *args)
{
    PyObject *envelope, *message, *loads, *flags, *nil;
    static const char *const env_names[] = {"journal", "begin", "end", "message", "_ids"};
    static const char *const msg_names[] = {"doc", "uuid_field"};
    if (!PyArg_ParseTuple(args, "OOOO!O!:configure", &envelope, &message, &loads,
                          &PyTuple_Type, &flags, &PyTuple_Type, &nil))
        return NULL;
    if (PyTuple_GET_SIZE(flags) != 1024) {
        PyErr_SetString(PyExc_ValueError, "configure() needs the 1024 flag values");
        return NULL;
    }
    if (slot_class(envelope, env_names, 5, &envelope_cls) < 0 ||
        slot_class(message, msg_names, 2, &message_cls) < 0)
        return NULL;
    Py_XSETREF(loads_func, Py_NewRef(loads));
    Py_XSETREF(flag_values, Py_NewRef(flags));
    Py_XSETREF(nil_fields, Py_NewRef(nil));
    Py_RETURN_NONE;
}

/* A new instance of a configured slots class with its slots set (references stolen). */
static PyObject *
build(SlotClass *cls, PyObject **values)
{
    PyObject *obj = cls->type->tp_alloc(cls->type, 0);
    if (obj == NULL) {
        for (int i = 0; i < cls->n; i++)
            Py_XDECREF(values[i]);
        return NULL;
    }
    for (int i = 0; i < cls->n; i++)
        *(PyObject **)((char *)obj + cls->off[i]) = values[i];
    return obj;
}

/* Byte values of two hex digits, indexed by the digits' two bytes (first << 8 | second);
 * 0x100 marks a pair that is not two hex digits. */
static unsigned short HEX2[1 << 16];

static void
init_hex(void)
{
    signed char value[256];
    memset(value, -1, sizeof value);
    for (int i = 0; i < 10; i++)
        value['0' + i] = (signed char)i;
    for (int i = 0; i < 6; i++)
        value['a' + i] = value['A' + i] = (signed char)(10 + i);
    for (int hi = 0; hi < 256; hi++)
        for (int lo = 0; lo < 256; lo++)
            HEX2[hi << 8 | lo] = value[hi] < 0 || value[lo] < 0
                                     ? 0x100 : (unsigned short)(value[hi] << 4 | value[lo]);
}

/* Where the 16 digit pairs of a canonical UUID string start (dashes at 8, 13, 18 and 23). */
static const unsigned char PAIR_AT[16] = {
    0, 2, 4, 6, 9, 11, 14, 16, 19, 21, 24, 26, 28, 30, 32, 34,
};

/* The 16 bytes of a canonical 36-character UUID string; 0 if it is not one. */
static int
uuid_bytes(PyObject *text, unsigned char out[16])
{
    if (!PyUnicode_Check(text) || PyUnicode_GET_LENGTH(text) != 36 ||
        PyUnicode_KIND(text) != PyUnicode_1BYTE_KIND)
        return 0;
    const unsigned char *s = PyUnicode_1BYTE_DATA(text);
    if (s[8] != '-' || s[13] != '-' || s[18] != '-' || s[23] != '-')
        return 0;
    unsigned int bad = 0;
    for (int k = 0; k < 16; k++) {
        const unsigned char *d = s + PAIR_AT[k];
        unsigned int v = HEX2[d[0] << 8 | d[1]];
        bad |= v;
        out[k] = (unsigned char)v;
    }
    return !(bad & 0x100);
}

static PyObject *
producer_bytes(const unsigned char *node)
{
    unsigned long long v = 0;
    for (int i = 0; i < 6; i++)
        v = (v << 8) | node[i];
    size_t slot = (size_t)((v ^ (v >> 17) ^ (v >> 31)) % PRODUCER_CACHE);
    if (cache_bytes[slot] != NULL && cache_node[slot] == v)
        return Py_NewRef(cache_bytes[slot]);
    PyObject *b = PyBytes_FromStringAndSize((const char *)node, 6);
    if (b == NULL)
        return NULL;
    Py_XSETREF(cache_bytes[slot], Py_NewRef(b));
    cache_node[slot] = v;
    return b;
}

/* (producer, clock, flags) of a UUID value, DESIGN.md §2; NULL with an error set on failure,
 * or a new reference to None when the value is left for lazy parsing. */
static PyObject *
ids_of(PyObject *value)
{
    if (value == NULL || value == Py_None)
        return Py_NewRef(nil_fields);
    if (PyUnicode_Check(value) && PyUnicode_GET_LENGTH(value) == 0)
        return Py_NewRef(nil_fields);
    unsigned char b[16];
    if (!uuid_bytes(value, b))
        Py_RETURN_NONE;
    unsigned long long hi = ((unsigned long long)(b[6] & 0x0f) << 8) | b[7];
    unsigned long long mid = ((unsigned long long)b[4] << 8) | b[5];
    unsigned long long low = ((unsigned long long)b[0] << 24) | ((unsigned long long)b[1] << 16) |
                             ((unsigned long long)b[2] << 8) | b[3];
    unsigned long long clock = (((hi << 48) | (mid << 32) | low) << 4) | ((b[8] >> 2) & 0x0f);
    unsigned int flags = ((unsigned int)(b[8] & 0x03) << 8) | b[9];
    PyObject *producer = producer_bytes(b + 10);
    if (producer == NULL)
        return NULL;
    PyObject *c = PyLong_FromUnsignedLongLong(clock);
    if (c == NULL) {
        Py_DECREF(producer);
        return NULL;
    }
    PyObject *f = Py_NewRef(PyTuple_GET_ITEM(flag_values, flags));
    PyObject *ids = PyTuple_New(3);
    if (ids == NULL) {
        Py_DECREF(producer);
        Py_DECREF(c);
        Py_DECREF(f);
        return NULL;
    }
    PyTuple_SET_ITEM(ids, 0, producer);
    PyTuple_SET_ITEM(ids, 1, c);
    PyTuple_SET_ITEM(ids, 2, f);
    /* Immutable, and nothing in it can refer back to it: never part of a cycle, so the
     * collector need not look at it (CPython untracks such tuples itself, but only after
     * a collection has traversed them once). */
    PyObject_GC_UnTrack(ids);
    return ids;
}

static PyObject *
decode_json_lines(PyObject *self, PyObject *args)
{
    Py_buffer buf;
    long long base;
    PyObject *journal, *uuid_field;
    Py_ssize_t limit;
    if (!PyArg_ParseTuple(args, "y*LUUn:decode_json_lines", &buf, &base, &journal, &uuid_field,
                          &limit))
        return NULL;
    if (envelope_cls.type == NULL) {
        PyBuffer_Release(&buf);
        PyErr_SetString(PyExc_RuntimeError, "oncelog._speedups is not configured");
        return NULL;
    }
    if (limit < 0 || limit > buf.len)
        limit = buf.len;
    PyObject *out = PyList_New(0);
    if (out == NULL) {
        PyBuffer_Release(&buf);
        return NULL;
    }
    const char *data = buf.buf;
    Py_ssize_t pos = 0;
    PyObject *last_end = NULL;
    while (pos < limit) {
        const char *nl = memchr(data + pos, '\n', (size_t)(limit - pos));
        if (nl == NULL)
            break;
        Py_ssize_t stop = nl - data + 1;
        PyObject *line = PyBytes_FromStringAndSize(data + pos, stop - pos);
        if (line == NULL)
            goto error;
        PyObject *doc = PyObject_CallOneArg(loads_func, line);
        Py_DECREF(line);
        if (doc == NULL) {
            if (PyErr_ExceptionMatches(value_error)) {
                PyErr_Clear(); /* a malformed frame: the Python path reports it */
                break;
            }
            goto error;
        }
        if (!PyDict_Check(doc)) {
            Py_DECREF(doc);
            break;
        }
        PyObject *ids = ids_of(PyDict_GetItemWithError(doc, uuid_field));
        if (ids == NULL) {
            Py_DECREF(doc);
            goto error;
        }
        PyObject *msg_values[2] = {doc, Py_NewRef(uuid_field)};
        PyObject *msg = build(&message_cls, msg_values);
        if (msg == NULL) {
            Py_DECREF(ids);
            goto error;
        }
        /* One int object for a frame's end and the next frame's begin. */
        PyObject *begin = last_end != NULL ? last_end : PyLong_FromLongLong(base + pos);
        last_end = NULL;
        PyObject *end = PyLong_FromLongLong(base + stop);
        if (begin == NULL || end == NULL) {
            Py_XDECREF(begin);
            Py_XDECREF(end);
            Py_DECREF(msg);
            Py_DECREF(ids);
            goto error;
        }
        last_end = Py_NewRef(end);
        PyObject *env_values[5] = {Py_NewRef(journal), begin, end, msg, ids};
        PyObject *env = build(&envelope_cls, env_values);
        if (env == NULL)
            goto error;
        int rc = PyList_Append(out, env);
        Py_DECREF(env);
        if (rc < 0)
            goto error;
        pos = stop;
    }
    Py_XDECREF(last_end);
    PyBuffer_Release(&buf);
    return Py_BuildValue("(Nn)", out, pos);
error:
    Py_XDECREF(last_end);
    PyBuffer_Release(&buf);
    Py_DECREF(out);
    return NULL;
}

static PyObject *
uuid_ids(PyObject *self, PyObject *value)
{
    if (nil_fields == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "oncelog._speedups is not configured");
        return NULL;
    }
    return ids_of(value);
}


/* ---------------------------------------------------------------------------------------
 * Sequencing: the common outcomes of Sequencer.sequence() (oncelog/sequencer.py,
 * `_sequence`), statement for statement, on the Sequencer's own state. Everything else
 * (nil UUIDs, new producers, ACK_EMPTY, replays, rollbacks below the last ACK, unknown
 * flags, values that are not plain ints) goes through Sequencer._sequence_one(), the same
 * Python the pure path runs, so both paths leave the sequencer in the same state at
 * every envelope they yield.
 */

enum { SQ_OFFSETS, SQ_PARTIALS, SQ_PENDING, SQ_EMIT, SQ_DEQUEUED, SQ_DEQUEUED_CLOCK, SQ_RING,
       SQ_NEXT, SQ_OWNER, SQ_HEAD, SQ_N };
enum { PA_MIN, PA_MAX, PA_BEGIN, PA_START, PA_STOP, PA_N };
enum { ENV_JOURNAL, ENV_BEGIN, ENV_END, ENV_MESSAGE, ENV_IDS };

static PyTypeObject *sequencer_type = NULL;
static Py_ssize_t seq_off[SQ_N];
static PyTypeObject *partial_type = NULL;
static Py_ssize_t part_off[PA_N];
static PyObject *ack_flag = NULL; /* Flags.ACK_TXN */
static PyObject *minus_one = NULL;
static PyObject *zero = NULL;

#define SLOT(obj, off) (*(PyObject **)((char *)(obj) + (off)))
#define SEQ(it, k) SLOT((it)->seq, seq_off[k])
#define PART(p, k) SLOT((p), part_off[k])
#define ENV(e, k) SLOT((e), envelope_cls.off[k])

static int
set_slot(PyObject *obj, Py_ssize_t off, PyObject *value)
{
    PyObject *old = SLOT(obj, off);
    SLOT(obj, off) = Py_NewRef(value);
    Py_XDECREF(old);
    return 0;
}

static PyObject *
configure_sequencer(PyObject *self, PyObject *args)
{
    PyObject *sequencer, *partial, *ack;
    static const char *const seq_names[] = {"_offsets", "_partials", "_pending", "_emit",
                                            "_dequeued", "_dequeued_clock", "_ring", "_next",
                                            "_owner", "_head"};
    static const char *const part_names[] = {"min_clock", "max_clock", "begin", "ring_start",
                                             "ring_stop"};
    if (!PyArg_ParseTuple(args, "OOO:configure_sequencer", &sequencer, &partial, &ack))
        return NULL;
    Py_ssize_t soff[SQ_N], poff[PA_N];
    if (slot_offsets(sequencer, seq_names, SQ_N, soff) < 0 ||
        slot_offsets(partial, part_names, PA_N, poff) < 0)
        return NULL;
    memcpy(seq_off, soff, sizeof soff);
    memcpy(part_off, poff, sizeof poff);
    Py_XSETREF(sequencer_type, (PyTypeObject *)Py_NewRef(sequencer));
    Py_XSETREF(partial_type, (PyTypeObject *)Py_NewRef(partial));
    Py_XSETREF(ack_flag, Py_NewRef(ack));
    if (minus_one == NULL)
        minus_one = PyLong_FromLong(-1);
    if (zero == NULL)
        zero = PyLong_FromLong(0);
    if (minus_one == NULL || zero == NULL)
        return NULL;
    Py_RETURN_NONE;
}

typedef enum { AT_TOP, AFTER_OUTSIDE, IN_WALK, IN_SUB, FINISHED } SeqState;

typedef struct {
    PyObject_HEAD
    PyObject *seq, *it, *replay, *sub;
    int acks;
    PyObject *ring, *nxt, *owner, *offsets, *partials, *pending;
    Py_ssize_t size;
    PyObject *journal, *by_producer;
    SeqState state;
    PyObject *env, *p, *e;         /* the envelope being queued, its partial, the one yielded */
    PyObject *clock_obj;           /* env's clock */
    PyObject *flags_obj;           /* env's flags */
    unsigned long long clock, mn;  /* env's clock, the partial's min_clock during a walk */
    long flags;                    /* env's flags */
    Py_ssize_t walk;               /* next ring index of the walk */
    PyObject **index;              /* ints 0..size-1, made on demand */
} SeqIter;

static PyTypeObject SeqIterType;

static PyObject *
index_obj(SeqIter *it, Py_ssize_t i)
{
    if (it->index[i] == NULL) {
        it->index[i] = PyLong_FromSsize_t(i);
        if (it->index[i] == NULL)
            return NULL;
    }
    return it->index[i];
}

/* A slot holding an int as a C value; 0 with no error set if it is not a plain int in range.
 * Public C API only: clocks below 2**63 (all of them until the year 5236) take
 * PyLong_AsLongLongAndOverflow, which reads the digits directly on every version; larger
 * ones PyLong_AsUnsignedLongLong. */
static int
as_ull(PyObject *v, unsigned long long *out)
{
    if (v == NULL || !PyLong_Check(v))
        return 0;
    int overflow;
    long long s = PyLong_AsLongLongAndOverflow(v, &overflow);
    if (overflow == 0) {
        if (s == -1 && PyErr_Occurred()) {
            PyErr_Clear();
            return 0;
        }
        if (s < 0)
            return 0;
        *out = (unsigned long long)s;
        return 1;
    }
    if (overflow < 0)
        return 0;
    unsigned long long x = PyLong_AsUnsignedLongLong(v);
    if (x == (unsigned long long)-1 && PyErr_Occurred()) {
        PyErr_Clear();
        return 0;
    }
    *out = x;
    return 1;
}

static int
as_ssize(PyObject *v, Py_ssize_t *out)
{
    if (v == NULL || !PyLong_Check(v))
        return 0;
    Py_ssize_t x = PyLong_AsSsize_t(v);
    if (x == -1 && PyErr_Occurred()) {
        PyErr_Clear();
        return 0;
    }
    *out = x;
    return 1;
}

static void
clear_current(SeqIter *it)
{
    Py_CLEAR(it->env);
    Py_CLEAR(it->p);
    Py_CLEAR(it->e);
    Py_CLEAR(it->clock_obj);
    Py_CLEAR(it->flags_obj);
}

static PyObject *
seqiter_new(PyObject *self, PyObject *args)
{
    PyObject *seq, *envelopes, *replay;
    int acks;
    if (!PyArg_ParseTuple(args, "OOOp:Sequence", &seq, &envelopes, &replay, &acks))
        return NULL;
    if (sequencer_type == NULL || envelope_cls.type == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "oncelog._speedups is not configured");
        return NULL;
    }
    if (!PyObject_TypeCheck(seq, sequencer_type)) {
        PyErr_SetString(PyExc_TypeError, "Sequence() needs a Sequencer");
        return NULL;
    }
    PyObject *iter = PyObject_GetIter(envelopes);
    if (iter == NULL)
        return NULL;
    SeqIter *it = PyObject_GC_New(SeqIter, &SeqIterType);
    if (it == NULL) {
        Py_DECREF(iter);
        return NULL;
    }
    it->seq = Py_NewRef(seq);
    it->it = iter;
    it->replay = Py_NewRef(replay);
    it->sub = NULL;
    it->acks = acks;
    it->ring = Py_NewRef(SEQ(it, SQ_RING));
    it->nxt = Py_NewRef(SEQ(it, SQ_NEXT));
    it->owner = Py_NewRef(SEQ(it, SQ_OWNER));
    it->offsets = Py_NewRef(SEQ(it, SQ_OFFSETS));
    it->partials = Py_NewRef(SEQ(it, SQ_PARTIALS));
    it->pending = Py_NewRef(SEQ(it, SQ_PENDING));
    it->journal = NULL;
    it->by_producer = NULL;
    it->state = AT_TOP;
    it->env = it->p = it->e = it->clock_obj = it->flags_obj = NULL;
    it->clock = it->mn = 0;
    it->flags = 0;
    it->walk = -1;
    it->index = NULL;
    it->size = PyList_Check(it->ring) ? PyList_GET_SIZE(it->ring) : 0;
    if (!PyList_CheckExact(it->ring) || !PyList_CheckExact(it->nxt) ||
        !PyList_CheckExact(it->owner) || !PyDict_CheckExact(it->offsets) ||
        !PyDict_CheckExact(it->partials) || !PySet_Check(it->pending) || it->size < 1 ||
        PyList_GET_SIZE(it->nxt) != it->size || PyList_GET_SIZE(it->owner) != it->size) {
        PyErr_SetString(PyExc_TypeError, "Sequence(): unexpected Sequencer state");
        Py_DECREF(it);
        return NULL;
    }
    it->index = PyMem_Calloc((size_t)it->size, sizeof(PyObject *));
    if (it->index == NULL) {
        Py_DECREF(it);
        return PyErr_NoMemory();
    }
    PyObject_GC_Track(it);
    return (PyObject *)it;
}

static int
seqiter_clear(SeqIter *it)
{
    Py_CLEAR(it->seq);
    Py_CLEAR(it->it);
    Py_CLEAR(it->replay);
    Py_CLEAR(it->sub);
    Py_CLEAR(it->ring);
    Py_CLEAR(it->nxt);
    Py_CLEAR(it->owner);
    Py_CLEAR(it->offsets);
    Py_CLEAR(it->partials);
    Py_CLEAR(it->pending);
    Py_CLEAR(it->journal);
    Py_CLEAR(it->by_producer);
    clear_current(it);
    if (it->index != NULL) {
        for (Py_ssize_t i = 0; i < it->size; i++)
            Py_CLEAR(it->index[i]);
    }
    return 0;
}

static void
seqiter_dealloc(SeqIter *it)
{
    PyObject_GC_UnTrack(it);
    seqiter_clear(it);
    PyMem_Free(it->index);
    PyObject_GC_Del(it);
}

static int
seqiter_traverse(SeqIter *it, visitproc visit, void *arg)
{
    Py_VISIT(it->seq);
    Py_VISIT(it->it);
    Py_VISIT(it->replay);
    Py_VISIT(it->sub);
    Py_VISIT(it->ring);
    Py_VISIT(it->nxt);
    Py_VISIT(it->owner);
    Py_VISIT(it->offsets);
    Py_VISIT(it->partials);
    Py_VISIT(it->pending);
    Py_VISIT(it->journal);
    Py_VISIT(it->by_producer);
    Py_VISIT(it->env);
    Py_VISIT(it->p);
    Py_VISIT(it->e);
    Py_VISIT(it->clock_obj);
    Py_VISIT(it->flags_obj);
    return 0;
}

/* Put `env` at the ring's head for partial `p` (the ring slot, next link and owner). */
static int
ring_put(SeqIter *it, Py_ssize_t head, PyObject *env, PyObject *p)
{
    if (PyList_SetItem(it->ring, head, Py_NewRef(env)) < 0 ||
        PyList_SetItem(it->nxt, head, Py_NewRef(minus_one)) < 0 ||
        PyList_SetItem(it->owner, head, Py_NewRef(p)) < 0)
        return -1;
    return 0;
}

/* Advance the head past `head`; returns the new head's int object (borrowed) or NULL. */
static PyObject *
advance_head(SeqIter *it, Py_ssize_t head)
{
    head += 1;
    if (head == it->size)
        head = 0;
    PyObject *h = index_obj(it, head);
    if (h == NULL)
        return NULL;
    set_slot(it->seq, seq_off[SQ_HEAD], h);
    return h;
}

static int
interfered(SeqIter *it, PyObject *expected)
{
    if (SEQ(it, SQ_DEQUEUED) == expected)
        return 0;
    PyObject *r = PyObject_CallMethod(it->seq, "_raise_interfered", NULL);
    Py_XDECREF(r);
    if (r != NULL)
        PyErr_SetString(PyExc_RuntimeError, "sequence(): the sequencer was stepped meanwhile");
    return -1;
}

/* The end of a committed sequence (after an OUTSIDE_COMMIT or a ring walk). */
static void
drained(SeqIter *it)
{
    set_slot(it->seq, seq_off[SQ_EMIT], Py_None);
    set_slot(it->seq, seq_off[SQ_DEQUEUED], Py_None);
    set_slot(it->seq, seq_off[SQ_DEQUEUED_CLOCK], zero);
}

/* Continue the ring walk of an ACK_COMMIT_RING: the next envelope to yield (new reference),
 * or NULL: the walk is over (error set if it failed). */
static PyObject *
walk_on(SeqIter *it)
{
    PyObject *p = it->p;
    while (it->walk != -1) {
        Py_ssize_t i = it->walk;
        PyObject *e = PyList_GET_ITEM(it->ring, i);
        Py_ssize_t next;
        if (!as_ssize(PyList_GET_ITEM(it->nxt, i), &next) || next < -1 || next >= it->size) {
            PyErr_Format(PyExc_RuntimeError, "sequencer ring link at %zd is corrupt", i);
            return NULL;
        }
        it->walk = next;
        if (e == NULL || e == Py_None) {
            PyErr_Format(PyExc_RuntimeError, "sequencer ring slot %zd is empty", i);
            return NULL;
        }
        Py_INCREF(e);
        PyObject *ids = ENV(e, ENV_IDS);
        if (ids == NULL || ids == Py_None) {
            ids = PyObject_GetAttrString(e, "ids");
        } else {
            Py_INCREF(ids);
        }
        if (ids == NULL) {
            Py_DECREF(e);
            return NULL;
        }
        PyObject *c_obj = PyTuple_Check(ids) && PyTuple_GET_SIZE(ids) == 3
                              ? PyTuple_GET_ITEM(ids, 1) : NULL;
        unsigned long long c;
        if (c_obj == NULL || !as_ull(c_obj, &c)) {
            Py_DECREF(ids);
            Py_DECREF(e);
            PyErr_SetString(PyExc_TypeError, "envelope ids must be (producer, clock, flags)");
            return NULL;
        }
        Py_INCREF(c_obj);
        Py_DECREF(ids);
        if (c <= it->mn || c > it->clock) {
            Py_DECREF(c_obj);
            Py_DECREF(e);
            continue; /* a duplicate, or not committed by this ACK */
        }
        if (e == it->env && !it->acks && it->flags == 2) { /* the committing ACK_TXN */
            set_slot(p, part_off[PA_MIN], c_obj); /* as if yielded and stepped past */
            it->mn = c;
            Py_DECREF(c_obj);
            Py_DECREF(e);
            continue;
        }
        PyObject *start = next == -1 ? minus_one : index_obj(it, next);
        if (start == NULL) {
            Py_DECREF(c_obj);
            Py_DECREF(e);
            return NULL;
        }
        set_slot(p, part_off[PA_START], start);
        set_slot(p, part_off[PA_BEGIN], ENV(e, ENV_BEGIN));
        set_slot(it->seq, seq_off[SQ_DEQUEUED], e);
        set_slot(it->seq, seq_off[SQ_DEQUEUED_CLOCK], c_obj);
        Py_XSETREF(it->e, Py_NewRef(e));
        /* Remember the clock of what is yielded: min_clock moves to it on resuming. */
        Py_XSETREF(it->clock_obj, c_obj);
        it->state = IN_WALK;
        return e;
    }
    return NULL;
}

/* After a walk: the sequence is drained. */
static int
walk_done(SeqIter *it)
{
    PyObject *p = it->p;
    PyObject *mn = PART(p, PA_MIN);
    set_slot(p, part_off[PA_MAX], mn);
    set_slot(p, part_off[PA_BEGIN], minus_one);
    set_slot(p, part_off[PA_START], minus_one);
    set_slot(p, part_off[PA_STOP], minus_one);
    if (PySet_Discard(it->pending, p) < 0)
        return -1;
    if (PyDict_SetItem(it->offsets, it->journal, ENV(it->env, ENV_END)) < 0)
        return -1;
    drained(it);
    clear_current(it);
    it->state = AT_TOP;
    return 0;
}

static PyObject *
seqiter_fail(SeqIter *it)
{
    it->state = FINISHED;
    clear_current(it);
    Py_CLEAR(it->sub);
    return NULL;
}

/* One envelope through the Python path (`Sequencer._sequence_one`): a generator of what it
 * commits, drained before the next envelope. */
static PyObject *
slow_path(SeqIter *it, PyObject *env)
{
    PyObject *sub = PyObject_CallMethod(it->seq, "_sequence_one", "OOO", env, it->replay,
                                        it->acks ? Py_True : Py_False);
    if (sub == NULL)
        return NULL;
    PyObject *first = PyIter_Next(sub);
    if (first == NULL) {
        Py_DECREF(sub);
        return NULL; /* nothing committed (or an error, which the caller checks) */
    }
    Py_XSETREF(it->sub, sub);
    it->state = IN_SUB;
    return first;
}

static PyObject *
seqiter_next(SeqIter *it)
{
    PyObject *r;
    switch (it->state) {
    case FINISHED:
        return NULL;
    case AFTER_OUTSIDE: {
        if (interfered(it, it->env) < 0)
            return seqiter_fail(it);
        PyObject *p = it->p;
        set_slot(p, part_off[PA_MIN], it->clock_obj);
        set_slot(p, part_off[PA_BEGIN], minus_one);
        set_slot(p, part_off[PA_STOP], minus_one);
        if (PyDict_SetItem(it->offsets, it->journal, ENV(it->env, ENV_END)) < 0)
            return seqiter_fail(it);
        drained(it);
        clear_current(it);
        it->state = AT_TOP;
        break;
    }
    case IN_WALK: {
        if (interfered(it, it->e) < 0)
            return seqiter_fail(it);
        set_slot(it->p, part_off[PA_MIN], it->clock_obj);
        if (!as_ull(it->clock_obj, &it->mn))
            return seqiter_fail(it);
        r = walk_on(it);
        if (r != NULL)
            return r;
        if (PyErr_Occurred() || walk_done(it) < 0)
            return seqiter_fail(it);
        break;
    }
    case IN_SUB:
        r = PyIter_Next(it->sub);
        if (r != NULL)
            return r;
        if (PyErr_Occurred())
            return seqiter_fail(it);
        Py_CLEAR(it->sub);
        it->state = AT_TOP;
        break;
    case AT_TOP:
        break;
    }

    for (;;) {
        PyObject *env = PyIter_Next(it->it);
        if (env == NULL) {
            it->state = FINISHED;
            return NULL; /* the end, or the iterator's error */
        }
        Py_ssize_t head;
        if (!as_ssize(SEQ(it, SQ_HEAD), &head) || head < 0 || head >= it->size) {
            Py_DECREF(env);
            PyErr_SetString(PyExc_RuntimeError, "sequencer head is corrupt");
            return seqiter_fail(it);
        }
        /* Evict at head, as queue_uncommitted does. */
        PyObject *o = PyList_GET_ITEM(it->owner, head);
        if (o != Py_None) {
            Py_ssize_t start;
            if (as_ssize(PART(o, PA_START), &start) && start == head) {
                PyObject *res = PyObject_CallMethod(it->seq, "_evict_start", "On", o, head);
                if (res == NULL) {
                    Py_DECREF(env);
                    return seqiter_fail(it);
                }
                Py_DECREF(res);
            }
        }
        if (!PyObject_TypeCheck(env, envelope_cls.type))
            goto slow;
        PyObject *ids = ENV(env, ENV_IDS);
        if (ids == NULL || ids == Py_None || !PyTuple_CheckExact(ids) ||
            PyTuple_GET_SIZE(ids) != 3)
            goto slow;
        PyObject *producer = PyTuple_GET_ITEM(ids, 0);
        PyObject *clock_obj = PyTuple_GET_ITEM(ids, 1);
        PyObject *flags_obj = PyTuple_GET_ITEM(ids, 2);
        unsigned long long clock;
        long flags;
        if (!as_ull(clock_obj, &clock) || clock == 0 || !PyLong_Check(flags_obj))
            goto slow;
        flags = PyLong_AsLong(flags_obj);
        if (flags == -1 && PyErr_Occurred()) {
            PyErr_Clear();
            goto slow;
        }
        PyObject *journal = ENV(env, ENV_JOURNAL);
        if (journal == NULL)
            goto slow;
        if (journal != it->journal) {
            int same = it->journal != NULL
                           ? PyObject_RichCompareBool(journal, it->journal, Py_EQ) : 0;
            if (same < 0) {
                Py_DECREF(env);
                return seqiter_fail(it);
            }
            if (!same) {
                PyObject *bp = PyDict_GetItemWithError(it->partials, journal);
                if (bp == NULL) {
                    if (PyErr_Occurred()) {
                        Py_DECREF(env);
                        return seqiter_fail(it);
                    }
                    bp = PyDict_New();
                    if (bp == NULL || PyDict_SetItem(it->partials, journal, bp) < 0) {
                        Py_XDECREF(bp);
                        Py_DECREF(env);
                        return seqiter_fail(it);
                    }
                    Py_DECREF(bp); /* the dict of partials holds it */
                }
                Py_XSETREF(it->journal, Py_NewRef(journal));
                Py_XSETREF(it->by_producer, Py_NewRef(bp));
            }
        }
        if (!PyDict_CheckExact(it->by_producer))
            goto slow;
        PyObject *p = PyDict_GetItemWithError(it->by_producer, producer);
        if (p == NULL) {
            if (PyErr_Occurred()) {
                Py_DECREF(env);
                return seqiter_fail(it);
            }
            goto slow;
        }
        if (!PyObject_TypeCheck(p, partial_type))
            goto slow;
        unsigned long long pmax, pmin;
        long long pbegin;
        if (!as_ull(PART(p, PA_MAX), &pmax) || !as_ull(PART(p, PA_MIN), &pmin) ||
            PART(p, PA_BEGIN) == NULL || !PyLong_Check(PART(p, PA_BEGIN)))
            goto slow;
        pbegin = PyLong_AsLongLong(PART(p, PA_BEGIN));
        if (pbegin == -1 && PyErr_Occurred()) {
            PyErr_Clear();
            goto slow;
        }
        PyObject *h_obj = index_obj(it, head);
        if (h_obj == NULL) {
            Py_DECREF(env);
            return seqiter_fail(it);
        }

        if (flags == 1) { /* CONTINUE_TXN */
            if (clock > pmax) { /* CONTINUE_BEGIN_SPAN or _EXTEND_SPAN */
                Py_ssize_t stop;
                if (!as_ssize(PART(p, PA_STOP), &stop) || stop < -1 || stop >= it->size)
                    goto slow;
                if (pbegin == -1) {
                    set_slot(p, part_off[PA_BEGIN], ENV(env, ENV_BEGIN));
                    if (PySet_Add(it->pending, p) < 0)
                        goto fail_env;
                }
                if (ring_put(it, head, env, p) < 0)
                    goto fail_env;
                if (stop == -1)
                    set_slot(p, part_off[PA_START], h_obj);
                else if (PyList_SetItem(it->nxt, stop, Py_NewRef(h_obj)) < 0)
                    goto fail_env;
                set_slot(p, part_off[PA_STOP], h_obj);
                if (advance_head(it, head) == NULL)
                    goto fail_env;
                set_slot(p, part_off[PA_MAX], clock_obj);
            } /* else CONTINUE_ALREADY_ACKED or CONTINUE_TXN_CLOCK_LARGER */
            if (PyDict_SetItem(it->offsets, it->journal, ENV(env, ENV_END)) < 0)
                goto fail_env;
            Py_DECREF(env);
            continue;
        }

        if (flags == 0 && pbegin == -1) {
            if (clock <= pmin) { /* OUTSIDE_ALREADY_ACKED */
                if (PyDict_SetItem(it->offsets, it->journal, ENV(env, ENV_END)) < 0)
                    goto fail_env;
                Py_DECREF(env);
                continue;
            }
            /* OUTSIDE_COMMIT of a lone message, stepped at once. */
            if (ring_put(it, head, env, p) < 0)
                goto fail_env;
            set_slot(p, part_off[PA_STOP], h_obj);
            set_slot(p, part_off[PA_BEGIN], ENV(env, ENV_BEGIN));
            set_slot(p, part_off[PA_MAX], clock_obj);
            if (advance_head(it, head) == NULL)
                goto fail_env;
            set_slot(it->seq, seq_off[SQ_EMIT], p);
            set_slot(it->seq, seq_off[SQ_DEQUEUED], env);
            set_slot(it->seq, seq_off[SQ_DEQUEUED_CLOCK], clock_obj);
            it->env = env; /* owns the reference */
            it->p = Py_NewRef(p);
            it->clock_obj = Py_NewRef(clock_obj);
            it->state = AFTER_OUTSIDE;
            return Py_NewRef(env);
        }

        if (flags == 2) { /* ACK_TXN */
            if (clock == pmin) { /* ACK_ROLLBACK */
                set_slot(p, part_off[PA_MAX], clock_obj);
                set_slot(p, part_off[PA_BEGIN], minus_one);
                set_slot(p, part_off[PA_START], minus_one);
                set_slot(p, part_off[PA_STOP], minus_one);
                if (PySet_Discard(it->pending, p) < 0 ||
                    PyDict_SetItem(it->offsets, it->journal, ENV(env, ENV_END)) < 0)
                    goto fail_env;
                Py_DECREF(env);
                continue;
            }
            Py_ssize_t start, stop;
            if (!as_ssize(PART(p, PA_START), &start) || !as_ssize(PART(p, PA_STOP), &stop) ||
                start < -1 || start >= it->size || stop < -1 || stop >= it->size)
                goto slow;
            int in_ring = 0;
            if (clock > pmin && start != -1 && stop != -1) {
                PyObject *first = PyList_GET_ITEM(it->ring, start);
                if (first != Py_None && PyObject_TypeCheck(first, envelope_cls.type)) {
                    in_ring = PyObject_RichCompareBool(ENV(first, ENV_BEGIN),
                                                       PART(p, PA_BEGIN), Py_EQ);
                    if (in_ring < 0)
                        goto fail_env;
                }
            }
            if (in_ring) {
                /* ACK_COMMIT_RING: add the ACK, then step its sequence. */
                if (ring_put(it, head, env, p) < 0 ||
                    PyList_SetItem(it->nxt, stop, Py_NewRef(h_obj)) < 0)
                    goto fail_env;
                set_slot(p, part_off[PA_STOP], h_obj);
                if (advance_head(it, head) == NULL)
                    goto fail_env;
                set_slot(p, part_off[PA_MAX], clock_obj);
                set_slot(it->seq, seq_off[SQ_EMIT], p);
                it->env = env; /* owns the reference */
                it->p = Py_NewRef(p);
                it->flags_obj = Py_NewRef(flags_obj);
                it->flags = flags;
                it->clock = clock;
                it->mn = pmin;
                it->walk = start;
                PyObject *e = walk_on(it);
                if (e != NULL)
                    return e;
                if (PyErr_Occurred() || walk_done(it) < 0)
                    return seqiter_fail(it);
                continue;
            }
        }

    slow:
        /* Everything else goes through queue_uncommitted and step, in Python. */
        r = slow_path(it, env);
        Py_DECREF(env);
        if (r != NULL)
            return r;
        if (PyErr_Occurred())
            return seqiter_fail(it);
        continue;
    fail_env:
        Py_DECREF(env);
        return seqiter_fail(it);
    }
}

static PyObject *
seqiter_close(SeqIter *it, PyObject *unused)
{
    if (it->sub != NULL) {
        PyObject *r = PyObject_CallMethod(it->sub, "close", NULL);
        if (r == NULL)
            return NULL;
        Py_DECREF(r);
    }
    it->state = FINISHED;
    clear_current(it);
    Py_CLEAR(it->sub);
    Py_RETURN_NONE;
}

static PyMethodDef seqiter_methods[] = {
    {"close", (PyCFunction)seqiter_close, METH_NOARGS, "Stop sequencing."},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject SeqIterType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "oncelog._speedups.Sequence",
    .tp_basicsize = sizeof(SeqIter),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "Sequencer.sequence() in C (see oncelog/sequencer.py).",
    .tp_dealloc = (destructor)seqiter_dealloc,
    .tp_traverse = (traverseproc)seqiter_traverse,
    .tp_clear = (inquiry)seqiter_clear,
    .tp_iter = PyObject_SelfIter,
    .tp_iternext = (iternextfunc)seqiter_next,
    .tp_methods = seqiter_methods,
};

static PyMethodDef methods[] = {
    {"configure", configure, METH_VARARGS,
     "configure(Envelope, JSONMessage, loads, flag_values, nil_fields): set the classes built."},
    {"decode_json_lines", decode_json_lines, METH_VARARGS,
     "decode_json_lines(data, base, journal, uuid_field, limit) -> (envelopes, consumed):\n"
     "Envelopes of JSONMessages for the complete lines of data[:limit], stopping before the\n"
     "first line that is not a JSON object; consumed is where decoding stopped."},
    {"configure_sequencer", configure_sequencer, METH_VARARGS,
     "configure_sequencer(Sequencer, _Partial, Flags.ACK_TXN): set the classes sequenced."},
    {"Sequence", seqiter_new, METH_VARARGS,
     "Sequence(sequencer, envelopes, replay, acks) -> iterator: Sequencer.sequence() in C."},
    {"uuid_ids", uuid_ids, METH_O,
     "uuid_ids(value) -> (producer, clock, flags), or None if value is not a canonical UUID."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "oncelog._speedups",
    "C versions of the JSON-lines decode hot path (see oncelog.framing.jsonlines).", -1,
    methods,
};

PyMODINIT_FUNC
PyInit__speedups(void)
{
    value_error = PyExc_ValueError;
    init_hex();
    if (PyType_Ready(&SeqIterType) < 0)
        return NULL;
    return PyModule_Create(&module);
}
