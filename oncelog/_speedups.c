/* oncelog._speedups: the optional C fast paths of decoding and sequencing.
 *
 * Two extension types, each owning its state; nothing here writes into another
 * object's memory, reads CPython internals, or keeps process-wide state:
 *
 * - `Decoder(Envelope, JSONMessage, loads, flag_values, nil_fields)` turns the complete
 *   lines of a buffer into Envelopes of JSONMessages exactly as oncelog.framing.jsonlines
 *   does in Python, each with its canonical UUID string parsed into the cached
 *   (producer, clock, flags). The instances are made with the classes' own `__new__` and
 *   filled through their attributes' descriptors (the public descriptor protocol, as
 *   `setattr` does). It stops at the first line it cannot decode cleanly (bad JSON, not an
 *   object) and reports where: the Python path takes over and raises the error with its
 *   journal and offsets. Anything unusual about a UUID is left for Envelope to parse.
 * - `Kernel(offsets, states, buffer, warn, max_bytes=0)` is the sequencing kernel of
 *   oncelog.sequencer (`SequencingKernel`), rule for rule: the ring, the per-producer
 *   table, the read-through offsets and the committed sequence being stepped through are
 *   its own C state. `Sequencer` delegates to it when the extension is available; its
 *   `sequence()` iterator runs queue-then-step without returning to Python.
 *
 * Multi-phase initialisation (PEP 489): the types live in the module's state. The UUID
 * layout and flag values below are checked against oncelog.message (their one
 * definition) by oncelog._native when the module is loaded, through `LAYOUT`.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h> /* T_OBJECT_EX, READONLY: a slot's member kind (see AttrCache) */
#include <stdint.h>
#include <string.h>

/* The UUID layout and flags of oncelog.message (checked at load, see LAYOUT). */
#define OUTSIDE_TXN 0
#define CONTINUE_TXN 1
#define ACK_TXN 2
#define FLAGS_MASK 0x3FF
#define CLOCK_SEQ_BYTE 8
#define SEQ_COUNTER_SHIFT 10
#define SEQ_COUNTER_MASK 0xF
#define TIME_HI_MASK 0x0FFF
#define PRODUCER_BYTE 10
#define PRODUCER_ID_LEN 6
#define UNIX_EPOCH_OFFSET 122192928000000000LL /* 100 ns units, 1582-10-15 to 1970-01-01 */

/* QueueOutcome, in the order of OUTCOMES (their values in oncelog.sequencer). */
enum {
    O_OUTSIDE_ALREADY_ACKED, O_OUTSIDE_COMMIT, O_CONTINUE_ALREADY_ACKED,
    O_CONTINUE_TXN_CLOCK_LARGER, O_CONTINUE_BEGIN_SPAN, O_CONTINUE_EXTEND_SPAN,
    O_ACK_ROLLBACK, O_ACK_EMPTY, O_ACK_COMMIT_RING, O_ACK_COMMIT_REPLAY, O_N
};
static const char *const OUTCOME_VALUES[O_N] = {
    "outsideAlreadyAcked", "outsideCommit", "continueAlreadyAcked", "continueTxnClockLarger",
    "continueBeginSpan", "continueExtendSpan", "ackRollback", "ackEmpty", "ackCommitRing",
    "ackCommitReplay",
};

/* Warnings the kernel reports through its `warn` callback (texts in oncelog.sequencer). */
enum { W_UNEXPECTED_FLAGS, W_OUTSIDE_AFTER_PENDING, W_ACK_BELOW_LAST };

/* Envelope attributes the kernel reads. */
enum { F_JOURNAL, F_BEGIN, F_END, F_IDS, F_N };
static const char *const FIELD_NAMES[F_N] = {"journal", "begin", "end", "_ids"};

typedef struct {
    PyTypeObject *partial_type;
    PyTypeObject *kernel_type;
    PyTypeObject *seqiter_type;
    PyTypeObject *decoder_type;
    PyObject *names[F_N];
    PyObject *str_ids; /* "ids": the parsing property, when `_ids` is None */
} ModState;

static inline ModState *
state_of(PyObject *module)
{
    return (ModState *)PyModule_GetState(module);
}

/* --------------------------------------------------------------------------------------
 * Attribute access through a one-type cache of data descriptors.
 *
 * For an object of the cached type whose attribute is a data descriptor (a slot member or
 * a property: it takes precedence over any instance dict), calling the descriptor's own
 * __get__/__set__ is what PyObject_GetAttr/SetAttr would do, minus the lookup. Any other
 * case (another type, a type with its own __getattribute__/__setattr__, a plain class
 * attribute) takes PyObject_GetAttr/SetAttr. */

typedef struct {
    PyTypeObject *type; /* strong */
    PyObject *descr[F_N > 5 ? F_N : 5];
    descrgetfunc get[F_N > 5 ? F_N : 5];
    descrsetfunc set[F_N > 5 ? F_N : 5];
    /* For a writable `__slots__` member (T_OBJECT_EX) of the cached type: where its value
     * is stored in an instance, read and written there directly, as the member descriptor's
     * own __get__/__set__ would (the value, or an AttributeError while unset); else -1. */
    Py_ssize_t offset[F_N > 5 ? F_N : 5];
    int n;
} AttrCache;

static void
cache_clear(AttrCache *c)
{
    Py_CLEAR(c->type);
    for (int i = 0; i < c->n; i++) {
        Py_CLEAR(c->descr[i]);
        c->get[i] = NULL;
        c->set[i] = NULL;
        c->offset[i] = -1;
    }
}

static int
cache_traverse(AttrCache *c, visitproc visit, void *arg)
{
    Py_VISIT(c->type);
    for (int i = 0; i < c->n; i++)
        Py_VISIT(c->descr[i]);
    return 0;
}

static int
cache_fill(AttrCache *c, PyTypeObject *type, PyObject *const *names, int n)
{
    cache_clear(c);
    c->n = n;
    for (int i = 0; i < n; i++)
        c->offset[i] = -1;
    int generic = PyType_GetSlot(type, Py_tp_getattro) == (void *)PyObject_GenericGetAttr &&
                  PyType_GetSlot(type, Py_tp_setattro) == (void *)PyObject_GenericSetAttr;
    for (int i = 0; i < n && generic; i++) {
        PyObject *d = PyObject_GetAttr((PyObject *)type, names[i]);
        if (d == NULL) {
            if (!PyErr_ExceptionMatches(PyExc_AttributeError))
                return -1;
            PyErr_Clear();
            continue;
        }
        descrgetfunc get = (descrgetfunc)PyType_GetSlot(Py_TYPE(d), Py_tp_descr_get);
        descrsetfunc set = (descrsetfunc)PyType_GetSlot(Py_TYPE(d), Py_tp_descr_set);
        if (get == NULL || set == NULL) {
            Py_DECREF(d); /* not a data descriptor: an instance dict could shadow it */
            continue;
        }
        c->descr[i] = d;
        c->get[i] = get;
        c->set[i] = set;
        /* A member of the type's own layout (a descriptor borrowed from another class
         * is left to its __get__/__set__, which reject the instance). */
        if (Py_IS_TYPE(d, &PyMemberDescr_Type) &&
            PyType_IsSubtype(type, PyDescr_TYPE(d))) {
            PyMemberDef *m = ((PyMemberDescrObject *)d)->d_member;
            if (m->type == T_OBJECT_EX && !(m->flags & READONLY))
                c->offset[i] = m->offset;
        }
    }
    c->type = (PyTypeObject *)Py_NewRef(type);
    return 0;
}

static inline PyObject *
cached_get(AttrCache *c, PyObject *const *names, int n, PyObject *obj, int i)
{
    PyTypeObject *type = Py_TYPE(obj);
    if (type != c->type && cache_fill(c, type, names, n) < 0)
        return NULL;
    if (c->offset[i] >= 0) {
        PyObject *v = *(PyObject **)((char *)obj + c->offset[i]);
        if (v != NULL)
            return Py_NewRef(v);
    }
    if (c->get[i] != NULL)
        return c->get[i](c->descr[i], obj, (PyObject *)type);
    return PyObject_GetAttr(obj, names[i]);
}

/* Raise oncelog.sequencer.<name>(*args) (args stolen; NULL: an error is already set). */
static void
raise_sequencer_error(const char *name, PyObject *args)
{
    if (args == NULL)
        return;
    PyObject *mod = PyImport_ImportModule("oncelog.sequencer");
    PyObject *cls = mod != NULL ? PyObject_GetAttrString(mod, name) : NULL;
    Py_XDECREF(mod);
    if (cls != NULL) {
        PyObject *exc = PyObject_CallObject(cls, args);
        if (exc != NULL) {
            PyErr_SetObject((PyObject *)Py_TYPE(exc), exc);
            Py_DECREF(exc);
        }
        Py_DECREF(cls);
    }
    Py_DECREF(args);
}

static void
raise_message(const char *name, PyObject *message)
{
    raise_sequencer_error(name, message != NULL ? PyTuple_Pack(1, message) : NULL);
    Py_XDECREF(message);
}

/* --------------------------------------------------------------------------------------
 * Partial: a producer's partial sequence within one journal (the kernel's record). */

typedef struct {
    PyObject_HEAD
    PyObject *journal;  /* str */
    PyObject *producer; /* bytes */
    uint64_t min_clock, max_clock;
    long long begin;    /* offset of the first pending message; -1: no transaction open */
    Py_ssize_t ring_start, ring_stop; /* its messages still in the ring; -1: none */
    char tracked;       /* filed in the kernel's table */
    char pending;       /* counted in the kernel's pending transactions */
} PartialObj;

static PartialObj *
partial_new(ModState *st, PyObject *journal, PyObject *producer, uint64_t last_ack,
            long long begin, int tracked)
{
    PartialObj *p = PyObject_New(PartialObj, st->partial_type);
    if (p == NULL)
        return NULL;
    p->journal = Py_NewRef(journal);
    p->producer = Py_NewRef(producer);
    p->min_clock = p->max_clock = last_ack;
    p->begin = begin;
    p->ring_start = p->ring_stop = -1;
    p->tracked = (char)tracked;
    p->pending = 0;
    return p;
}

static void
partial_dealloc(PartialObj *p)
{
    PyTypeObject *type = Py_TYPE(p);
    Py_XDECREF(p->journal);
    Py_XDECREF(p->producer);
    PyObject_Free(p);
    Py_DECREF(type);
}

static PyObject *
partial_state(PartialObj *p)
{
    return Py_BuildValue("(OOKKLnnO)", p->journal, p->producer, (unsigned long long)p->min_clock,
                         (unsigned long long)p->max_clock, p->begin, p->ring_start, p->ring_stop,
                         p->tracked ? Py_True : Py_False);
}

static PyType_Slot partial_slots[] = {
    {Py_tp_dealloc, partial_dealloc},
    {Py_tp_doc, "A producer's partial sequence in one journal (a Kernel record)."},
    {0, NULL},
};

static PyType_Spec partial_spec = {
    .name = "oncelog._speedups._Partial",
    .basicsize = sizeof(PartialObj),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_IMMUTABLETYPE | Py_TPFLAGS_DISALLOW_INSTANTIATION,
    .slots = partial_slots,
};

/* --------------------------------------------------------------------------------------
 * Kernel */

typedef struct {
    PyObject_HEAD
    ModState *st;
    Py_ssize_t size, head;
    /* A growing ring's byte budget (0: a fixed ring), and whether growth may be tried (not
     * for a fixed ring, nor after a refusal until the head wraps round). */
    long long max_bytes;
    int may_grow;
    /* The ring: envelope (NULL once step() took it), next index in its partial's chain
     * (-1: none), owning partial, and the envelope's begin and end offsets, clock and flags
     * (read once, when queued). */
    PyObject **ring;
    Py_ssize_t *next;
    PartialObj **owner;
    long long *rbegin, *rend;
    uint64_t *rclock;
    long *rflags;
    /* Delivered envelopes, oldest first: a circular queue of `size` places (see
     * delivered_push). */
    PyObject **delivered;
    Py_ssize_t delivered_head, delivered_n;
    PyObject *offsets;     /* dict: journal -> read-through offset */
    PyObject *off_journal; /* an offset not yet in `offsets`: journal -> off_env.end */
    PyObject *off_env;
    PyObject *partials;    /* dict: journal -> dict: producer -> Partial */
    PyObject *cur_journal; /* the journal last looked up, and its dict (NULL: none yet) */
    PyObject *cur_bp;
    Py_ssize_t npending;   /* partials with `pending` set */
    PartialObj *emit;      /* the committed sequence being stepped through, or NULL */
    PyObject *dequeued;    /* the envelope step() last returned (or skipped), or NULL */
    uint64_t dequeued_clock;
    PyObject *replay_it;   /* a replay being read, or NULL */
    PyObject *warn;        /* warn(env, producer, last_ack, begin, clock, flags, code) */
    AttrCache cache;       /* envelope attributes */
} KernelObj;

typedef struct {
    PyObject_HEAD
    KernelObj *k;
    PyObject *it;     /* the envelopes */
    PyObject *replay; /* replay(journal, begin, end), or None */
    int acks;
    int state;        /* TOP, STEPPING or DONE */
    PyObject *last;   /* the envelope last yielded */
} SeqIterObj;

enum { IT_TOP, IT_STEPPING, IT_DONE };

static inline PyObject *
env_get(KernelObj *k, PyObject *env, int field)
{
    return cached_get(&k->cache, k->st->names, F_N, env, field);
}

static int
as_u64(PyObject *v, uint64_t *out)
{
    if (!PyLong_Check(v)) {
        PyErr_Format(PyExc_TypeError, "a clock must be an int, not %.100s", Py_TYPE(v)->tp_name);
        return -1;
    }
    int overflow;
    long long s = PyLong_AsLongLongAndOverflow(v, &overflow);
    if (overflow == 0) {
        if (s == -1 && PyErr_Occurred())
            return -1;
        if (s < 0) {
            PyErr_SetString(PyExc_ValueError, "a clock must not be negative");
            return -1;
        }
        *out = (uint64_t)s;
        return 0;
    }
    unsigned long long x = PyLong_AsUnsignedLongLong(v);
    if (x == (unsigned long long)-1 && PyErr_Occurred())
        return -1;
    *out = x;
    return 0;
}

static int
as_offset(PyObject *v, long long *out)
{
    long long x = PyLong_AsLongLong(v);
    if (x == -1 && PyErr_Occurred())
        return -1;
    *out = x;
    return 0;
}

/* The (producer, clock, flags) of env: a new reference to the tuple (the producer is
 * borrowed from it), its clock and flags. */
static PyObject *
env_ids(KernelObj *k, PyObject *env, uint64_t *clock, long *flags)
{
    PyObject *ids = env_get(k, env, F_IDS);
    if (ids == Py_None) {
        Py_DECREF(ids);
        ids = PyObject_GetAttr(env, k->st->str_ids);
    }
    if (ids == NULL)
        return NULL;
    if (!PyTuple_Check(ids) || PyTuple_GET_SIZE(ids) != 3 ||
        !PyBytes_Check(PyTuple_GET_ITEM(ids, 0))) {
        Py_DECREF(ids);
        PyErr_SetString(PyExc_TypeError, "envelope ids must be (producer, clock, flags)");
        return NULL;
    }
    if (as_u64(PyTuple_GET_ITEM(ids, 1), clock) < 0) {
        Py_DECREF(ids);
        return NULL;
    }
    long f = PyLong_AsLong(PyTuple_GET_ITEM(ids, 2));
    if (f == -1 && PyErr_Occurred()) {
        Py_DECREF(ids);
        return NULL;
    }
    *flags = f;
    return ids;
}

static int
env_offset(KernelObj *k, PyObject *env, int field, long long *out)
{
    PyObject *v = env_get(k, env, field);
    if (v == NULL)
        return -1;
    int rc = as_offset(v, out);
    Py_DECREF(v);
    return rc;
}

/* ---- offsets: the last one set is kept as (journal, envelope) until needed */

static int
flush_offset(KernelObj *k)
{
    if (k->off_env == NULL)
        return 0;
    PyObject *end = env_get(k, k->off_env, F_END);
    if (end == NULL)
        return -1;
    int rc = PyDict_SetItem(k->offsets, k->off_journal, end);
    Py_DECREF(end);
    if (rc < 0)
        return -1;
    Py_CLEAR(k->off_env);
    Py_CLEAR(k->off_journal);
    return 0;
}

/* offsets[journal] = env.end */
static int
set_offset(KernelObj *k, PyObject *journal, PyObject *env)
{
    if (k->off_env != NULL && k->off_journal != journal) {
        int same = PyObject_RichCompareBool(k->off_journal, journal, Py_EQ);
        if (same < 0 || (!same && flush_offset(k) < 0))
            return -1;
    }
    Py_INCREF(journal);
    Py_XSETREF(k->off_journal, journal);
    Py_INCREF(env);
    Py_XSETREF(k->off_env, env);
    return 0;
}

static inline void
pending_add(KernelObj *k, PartialObj *p)
{
    if (!p->pending) {
        p->pending = 1;
        k->npending++;
    }
}

static inline void
pending_discard(KernelObj *k, PartialObj *p)
{
    if (p->pending) {
        p->pending = 0;
        k->npending--;
    }
}

/* The producer dict of `journal` (borrowed; *out NULL if it has none yet). */
static int
journal_table(KernelObj *k, PyObject *journal, PyObject **out)
{
    if (journal != k->cur_journal) {
        PyObject *bp = PyDict_GetItemWithError(k->partials, journal);
        if (bp == NULL && PyErr_Occurred())
            return -1;
        Py_INCREF(journal);
        Py_XSETREF(k->cur_journal, journal);
        Py_XINCREF(bp);
        Py_XSETREF(k->cur_bp, bp);
    }
    *out = k->cur_bp;
    return 0;
}

static int
track(KernelObj *k, PyObject *journal, PartialObj *p)
{
    PyObject *bp;
    if (journal_table(k, journal, &bp) < 0)
        return -1;
    if (bp == NULL) {
        bp = PyDict_New();
        if (bp == NULL)
            return -1;
        if (PyDict_SetItem(k->partials, journal, bp) < 0) {
            Py_DECREF(bp);
            return -1;
        }
        Py_XSETREF(k->cur_bp, bp); /* journal_table made `journal` the current one */
    }
    if (PyDict_SetItem(bp, p->producer, (PyObject *)p) < 0)
        return -1;
    p->tracked = 1;
    return 0;
}

static int
decide_outcome(uint64_t min_clock, uint64_t max_clock, int span_open, uint64_t clock, long flags)
{
    if (flags == CONTINUE_TXN) {
        if (clock <= max_clock)
            return clock <= min_clock ? O_CONTINUE_ALREADY_ACKED : O_CONTINUE_TXN_CLOCK_LARGER;
        return span_open ? O_CONTINUE_EXTEND_SPAN : O_CONTINUE_BEGIN_SPAN;
    }
    if (flags == ACK_TXN) {
        if (clock <= min_clock)
            return O_ACK_ROLLBACK;
        return span_open ? O_ACK_COMMIT_RING : O_ACK_EMPTY;
    }
    return clock <= min_clock ? O_OUTSIDE_ALREADY_ACKED : O_OUTSIDE_COMMIT;
}

/* The journal bytes of the envelopes in the ring (their end - begin), in *out: of every
 * slot ever filled, delivered or not (as SequencingKernel._held_bytes counts them). */
static int
ring_held(KernelObj *k, long long *out)
{
    long long held = 0;
    for (Py_ssize_t i = 0; i < k->size; i++)
        if (k->owner[i] != NULL)
            held += k->rend[i] - k->rbegin[i];
    *out = held;
    return 0;
}

/* ---- delivered envelopes
 *
 * step() takes an envelope it steps through that was queued at most DELIVERED_RECENT
 * queueings ago out of its ring slot (the slot is never read again: its chain has moved
 * past it) and puts it at the back of `delivered`; each queue_uncommitted that frees no
 * envelope of its own (its slot was empty) drops the envelope at the front. So a small
 * transaction's envelopes are freed a few dozen queueings after delivery, while their
 * objects are still in the CPU's caches, instead of a whole turn of the ring later (at
 * least 1,024 messages), when their slots are reused (read_committed to dicts, 16
 * producers: about 6% less CPU; one producer about 5%). Older envelopes (a large
 * transaction's first ones) stay in their slots and are freed when those are reused, as
 * before: moving them too made reading transactions of 10,000 messages about 6% slower.
 *
 * Freeing an envelope as soon as step() hands it out would be sooner still, but CPython's
 * collector counts allocations net of frees (and a free counts only while the count is
 * above zero): a transaction of 10,000 messages, freed in one burst at its commit, left
 * the next one's 10,000 envelopes to count up unopposed, and reading such a journal ran
 * 1.8x the CPU with ten times the young collections. Each queueing frees one envelope at
 * most (the one in its slot, else one delivered), so the ring keeps that pacing: one old
 * envelope freed per new one.
 *
 * Invariant: the envelopes referenced by the ring's slots plus those in `delivered` are
 * never more than `size` (a step moves one from a slot to the queue or leaves it; a
 * queueing frees the one in its slot, or, if that is empty, drops one from the queue, or
 * else fills an empty slot), so the queue never overflows, and an envelope is dropped
 * within `size` queueings of its delivery: nothing outlives the ring's turn. */

#define DELIVERED_RECENT 256

/* Drop the oldest delivered envelope, if any (taken out of the queue before its release,
 * which may run Python code). */
static inline void
delivered_drop(KernelObj *k)
{
    if (k->delivered_n == 0)
        return;
    Py_ssize_t at = k->delivered_head;
    PyObject *env = k->delivered[at];
    k->delivered[at] = NULL;
    k->delivered_head = at + 1 == k->size ? 0 : at + 1;
    k->delivered_n--;
    Py_DECREF(env);
}

/* Put env (a reference stolen from its ring slot) at the back of the delivered queue. */
static inline void
delivered_push(KernelObj *k, PyObject *env)
{
    if (k->delivered_n == k->size)
        delivered_drop(k); /* not reached (see the invariant above): a bound, not a rule */
    Py_ssize_t at = k->delivered_head + k->delivered_n;
    k->delivered[at >= k->size ? at - k->size : at] = env;
    k->delivered_n++;
}

/* Whether queueing next grows the ring rather than free slot `head`, which holds the first
 * message of an open transaction (1 or 0; -1 on error). Changes nothing. */
static int
grows_at(KernelObj *k, Py_ssize_t head)
{
    PartialObj *o = k->owner[head];
    if (!k->may_grow || o == NULL || o->ring_start != head || k->rbegin[head] != o->begin)
        return 0;
    long long held;
    if (ring_held(k, &held) < 0)
        return -1;
    return 2 * held <= k->max_bytes;
}

/* Double the ring, laid out again from the oldest slot (the head), if twice the bytes it
 * holds fit in the budget; otherwise clear may_grow until the head wraps round. 1 if it
 * grew, 0 if not, -1 on error. Called with the head slot holding the first message of an
 * open transaction and nothing being stepped through. Afterwards the old slots are
 * 0..size-1 in queue order, the head is the first new (empty) slot, and every chain names
 * the same envelopes as before. References move with their slots. */
static int
kgrow(KernelObj *k)
{
    long long held;
    if (ring_held(k, &held) < 0)
        return -1;
    if (2 * held > k->max_bytes) {
        k->may_grow = 0;
        return 0;
    }
    Py_ssize_t n = k->size, h = k->head, m = 2 * n;
    PyObject **ring = PyMem_Calloc((size_t)m, sizeof(PyObject *));
    Py_ssize_t *next = PyMem_Calloc((size_t)m, sizeof(Py_ssize_t));
    PartialObj **owner = PyMem_Calloc((size_t)m, sizeof(PartialObj *));
    long long *rbegin = PyMem_Calloc((size_t)m, sizeof(long long));
    long long *rend = PyMem_Calloc((size_t)m, sizeof(long long));
    uint64_t *rclock = PyMem_Calloc((size_t)m, sizeof(uint64_t));
    long *rflags = PyMem_Calloc((size_t)m, sizeof(long));
    PyObject **delivered = PyMem_Calloc((size_t)m, sizeof(PyObject *));
    if (ring == NULL || next == NULL || owner == NULL || rbegin == NULL || rend == NULL ||
        rclock == NULL || rflags == NULL || delivered == NULL) {
        PyMem_Free(ring);
        PyMem_Free(next);
        PyMem_Free(owner);
        PyMem_Free(rbegin);
        PyMem_Free(rend);
        PyMem_Free(rclock);
        PyMem_Free(rflags);
        PyMem_Free(delivered);
        PyErr_NoMemory();
        return -1;
    }
    /* Remap each chain's ends once: encoded as -2 - new index while the old slots are
     * scanned, so that a remapped end never matches an old index again. */
    for (Py_ssize_t i = 0; i < n; i++) {
        PartialObj *o = k->owner[i];
        if (o == NULL)
            continue;
        Py_ssize_t j = (i - h + n) % n;
        if (o->ring_start == i)
            o->ring_start = -2 - j;
        if (o->ring_stop == i)
            o->ring_stop = -2 - j;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PartialObj *o = k->owner[i];
        if (o == NULL)
            continue;
        if (o->ring_start <= -2)
            o->ring_start = -2 - o->ring_start;
        if (o->ring_stop <= -2)
            o->ring_stop = -2 - o->ring_stop;
    }
    for (Py_ssize_t j = 0; j < n; j++) {
        Py_ssize_t i = (h + j) % n;
        ring[j] = k->ring[i];
        owner[j] = k->owner[i];
        next[j] = k->next[i] == -1 ? -1 : (k->next[i] - h + n) % n;
        rbegin[j] = k->rbegin[i];
        rend[j] = k->rend[i];
        rclock[j] = k->rclock[i];
        rflags[j] = k->rflags[i];
    }
    for (Py_ssize_t j = n; j < m; j++)
        next[j] = -1;
    /* The delivered queue keeps its order, from its first place. */
    for (Py_ssize_t j = 0; j < k->delivered_n; j++)
        delivered[j] = k->delivered[(k->delivered_head + j) % n];
    PyMem_Free(k->ring);
    PyMem_Free(k->next);
    PyMem_Free(k->owner);
    PyMem_Free(k->rbegin);
    PyMem_Free(k->rend);
    PyMem_Free(k->rclock);
    PyMem_Free(k->rflags);
    PyMem_Free(k->delivered);
    k->ring = ring;
    k->next = next;
    k->owner = owner;
    k->rbegin = rbegin;
    k->rend = rend;
    k->rclock = rclock;
    k->rflags = rflags;
    k->delivered = delivered;
    k->delivered_head = 0;
    k->size = m;
    k->head = n;
    return 1;
}

/* Decide (no mutation): the outcome and the partial it applies to (a new reference; for a
 * producer new to its journal, or a nil UUID, a fresh untracked record). */
static int
decide(KernelObj *k, PyObject *journal, PyObject *producer, uint64_t clock, long flags,
       PartialObj **out)
{
    PartialObj *p = NULL;
    if (clock == 0) {
        *out = partial_new(k->st, journal, producer, 0, -1, 0);
        return *out == NULL ? -1 : O_OUTSIDE_COMMIT;
    }
    PyObject *bp;
    if (journal_table(k, journal, &bp) < 0)
        return -1;
    if (bp != NULL) {
        p = (PartialObj *)PyDict_GetItemWithError(bp, producer);
        if (p == NULL && PyErr_Occurred())
            return -1;
        Py_XINCREF(p);
    }
    if (p == NULL && (p = partial_new(k->st, journal, producer, clock - 1, -1, 0)) == NULL)
        return -1;
    int outcome = decide_outcome(p->min_clock, p->max_clock, p->begin != -1, clock, flags);
    if (outcome == O_ACK_COMMIT_RING) {
        Py_ssize_t start = p->ring_start;
        int keeps = 1;
        if (start == k->head && (keeps = grows_at(k, start)) < 0) {
            Py_DECREF(p);
            return -1;
        }
        if (start == -1 || !keeps || k->rbegin[start] != p->begin)
            outcome = O_ACK_COMMIT_REPLAY; /* all or part left the ring */
    }
    *out = p;
    return outcome;
}

static int
warn(KernelObj *k, PyObject *env, PartialObj *p, uint64_t clock, long flags, int code)
{
    PyObject *r = PyObject_CallFunction(k->warn, "OOKLKli", env, p->producer,
                                        (unsigned long long)p->min_clock, p->begin,
                                        (unsigned long long)clock, flags, code);
    Py_XDECREF(r);
    return r == NULL ? -1 : 0;
}

static int
evict_start(KernelObj *k, PartialObj *p, Py_ssize_t head)
{
    Py_ssize_t nxt = k->next[head];
    if ((p->ring_start == p->ring_stop) != (nxt == -1)) {
        PyObject *hex = PyObject_CallMethod(p->producer, "hex", NULL);
        if (hex != NULL)
            raise_message("SequencerError",
                          PyUnicode_FromFormat("ring invariant violated for journal %R producer %U",
                                               p->journal, hex));
        Py_XDECREF(hex);
        return -1;
    }
    if (nxt == -1)
        p->ring_start = p->ring_stop = -1; /* nothing of it is left in the ring */
    else
        p->ring_start = nxt;
    return 0;
}

static void
raise_busy(KernelObj *k, const char *what, PyObject *env)
{
    PyObject *hex = PyObject_CallMethod(k->emit->producer, "hex", NULL);
    if (hex == NULL)
        return;
    PyObject *at = NULL;
    if (env != NULL) {
        PyObject *journal = env_get(k, env, F_JOURNAL);
        PyObject *begin = journal != NULL ? env_get(k, env, F_BEGIN) : NULL;
        if (begin != NULL)
            at = PyUnicode_FromFormat(" (queuing journal %R offset %S)", journal, begin);
        Py_XDECREF(journal);
        Py_XDECREF(begin);
    } else {
        at = PyUnicode_FromString("");
    }
    if (at != NULL)
        raise_message("SequencerError",
                      PyUnicode_FromFormat("%s(): committed messages of journal %R producer %U"
                                           " remain: step() until it returns None first%U",
                                           what, k->emit->journal, hex, at));
    Py_DECREF(hex);
    Py_XDECREF(at);
}

/* queue_uncommitted: evict the head, decide, apply. The outcome, or -1 on error. */
static int
kqueue(KernelObj *k, PyObject *env)
{
    if (k->emit != NULL) {
        raise_busy(k, "queue_uncommitted", env);
        return -1;
    }
    Py_ssize_t head = k->head;
    int freed = 0; /* whether this queueing freed the envelope in its slot */
    PartialObj *o = k->owner[head];
    if (o != NULL && o->ring_start == head) {
        int grown = 0;
        if (k->may_grow && k->rbegin[head] == o->begin && (grown = kgrow(k)) < 0)
            return -1;
        if (grown)
            head = k->head;
        else if (evict_start(k, o, head) < 0)
            return -1;
    }

    uint64_t clock;
    long flags;
    PyObject *ids = env_ids(k, env, &clock, &flags);
    if (ids == NULL)
        return -1;
    PyObject *journal = env_get(k, env, F_JOURNAL);
    if (journal == NULL) {
        Py_DECREF(ids);
        return -1;
    }
    PartialObj *p = NULL;
    int outcome = decide(k, journal, PyTuple_GET_ITEM(ids, 0), clock, flags, &p);
    if (outcome < 0)
        goto fail;

    /* Apply. */
    if (!p->tracked && clock && track(k, journal, p) < 0)
        goto fail;
    int commit = 1, have_begin = 0;
    long long begin = -1;
    switch (outcome) {
    case O_CONTINUE_EXTEND_SPAN:
        commit = 0;
        break;
    case O_OUTSIDE_COMMIT:
        if (env_offset(k, env, F_BEGIN, &begin) < 0)
            goto fail;
        have_begin = 1;
        if (clock) {
            if (flags != OUTSIDE_TXN && warn(k, env, p, clock, flags, W_UNEXPECTED_FLAGS) < 0)
                goto fail;
            if (p->begin != -1 && warn(k, env, p, clock, flags, W_OUTSIDE_AFTER_PENDING) < 0)
                goto fail;
        }
        /* Any pending span is deliberately clobbered: an implicit rollback. */
        p->begin = begin;
        p->ring_stop = -1;
        break;
    case O_CONTINUE_BEGIN_SPAN:
        commit = 0;
        if (env_offset(k, env, F_BEGIN, &begin) < 0)
            goto fail;
        have_begin = 1;
        p->begin = begin;
        pending_add(k, p);
        break;
    case O_ACK_EMPTY:
        if (env_offset(k, env, F_BEGIN, &begin) < 0)
            goto fail;
        have_begin = 1;
        p->begin = begin;
        break;
    case O_ACK_COMMIT_RING:
    case O_ACK_COMMIT_REPLAY:
        break;
    default:
        /* *_ALREADY_ACKED, CONTINUE_TXN_CLOCK_LARGER, ACK_ROLLBACK leave the ring alone. */
        if (outcome == O_ACK_ROLLBACK) {
            /* Below the last ACK: an upstream consumer recovered an older checkpoint and
             * re-sent its ACKs; at-least-once for the interval, as Gazette does. */
            if (clock < p->min_clock && warn(k, env, p, clock, flags, W_ACK_BELOW_LAST) < 0)
                goto fail;
            p->min_clock = p->max_clock = clock;
            p->begin = p->ring_start = p->ring_stop = -1;
            pending_discard(k, p);
        }
        if (set_offset(k, journal, env) < 0)
            goto fail;
        goto done;
    }
    long long end;
    if ((!have_begin && env_offset(k, env, F_BEGIN, &begin) < 0) ||
        env_offset(k, env, F_END, &end) < 0)
        goto fail;
    /* Put env in the ring slot at the head, linked after the last entry of p's chain. */
    Py_INCREF(env);
    freed = k->ring[head] != NULL;
    Py_XSETREF(k->ring[head], env);
    k->next[head] = -1;
    Py_INCREF(p);
    Py_XSETREF(k->owner[head], p);
    k->rbegin[head] = begin;
    k->rend[head] = end;
    k->rclock[head] = clock;
    k->rflags[head] = flags;
    Py_ssize_t stop = p->ring_stop;
    if (stop == -1)
        p->ring_start = head;
    else
        k->next[stop] = head;
    p->ring_stop = head;
    if (head + 1 == k->size) {
        k->head = 0;
        k->may_grow = k->max_bytes > 0; /* a new turn: growth may be tried again */
    } else {
        k->head = head + 1;
    }
    p->max_clock = clock;
    if (!commit) {
        if (set_offset(k, journal, env) < 0)
            goto fail;
    } else {
        /* A commit, through `clock`; the offset moves when the sequence is drained. */
        Py_INCREF(p);
        Py_XSETREF(k->emit, p);
    }
done:
    Py_DECREF(p);
    Py_DECREF(journal);
    Py_DECREF(ids);
    if (!freed)
        delivered_drop(k); /* one envelope freed per envelope queued */
    return outcome;
fail:
    Py_XDECREF(p);
    Py_DECREF(journal);
    Py_DECREF(ids);
    return -1;
}

static int
check_replayed(KernelObj *k, PyObject *env, PartialObj *emit, long long *begin_out)
{
    long long end = k->rbegin[emit->ring_start];
    PyObject *journal = env_get(k, env, F_JOURNAL);
    if (journal == NULL)
        return -1;
    int same = PyObject_RichCompareBool(journal, emit->journal, Py_EQ);
    if (same <= 0) {
        if (same == 0)
            raise_message("ReplayError",
                          PyUnicode_FromFormat("replay of wrong journal %R (expected %R, offsets"
                                               " [%lld, %lld))", journal, emit->journal,
                                               emit->begin, end));
        Py_DECREF(journal);
        return -1;
    }
    Py_DECREF(journal);
    long long begin, env_end;
    if (env_offset(k, env, F_BEGIN, &begin) < 0 || env_offset(k, env, F_END, &env_end) < 0)
        return -1;
    if (begin < emit->begin) {
        raise_message("ReplayError",
                      PyUnicode_FromFormat("replay of journal %R has wrong begin offset %lld"
                                           " (expected >= %lld)", emit->journal, begin,
                                           emit->begin));
        return -1;
    }
    if (env_end > end) {
        raise_message("ReplayError",
                      PyUnicode_FromFormat("replay of journal %R has wrong end offset %lld"
                                           " (expected <= %lld)", emit->journal, env_end, end));
        return -1;
    }
    *begin_out = begin;
    return 0;
}

static PyObject *
replay_range(KernelObj *k)
{
    PartialObj *emit = k->emit;
    if (emit == NULL) {
        raise_message("SequencerError",
                      PyUnicode_FromString("replay_range(): no committed messages to step through"));
        return NULL;
    }
    if (emit->ring_start == -1) {
        raise_message("SequencerError",
                      PyUnicode_FromFormat("replay_range(): the committed sequence of journal %R"
                                           " has been stepped through the ring; nothing is left"
                                           " to replay", emit->journal));
        return NULL;
    }
    return Py_BuildValue("(OLL)", emit->journal, emit->begin, k->rbegin[emit->ring_start]);
}

/* step(): the next committed envelope (new reference; *flags its flags), or NULL: drained or
 * nothing to step through (no error set), or an error. */
static PyObject *
kstep(KernelObj *k, long *flags_out)
{
    PartialObj *emit = k->emit;
    if (emit == NULL)
        return NULL;
    Py_INCREF(emit); /* a replay runs Python code */
    Py_ssize_t start = emit->ring_start;
    if (k->dequeued == NULL) {
        if (k->replay_it == NULL && emit->begin != k->rbegin[start]) {
            PyObject *range = replay_range(k);
            if (range != NULL)
                raise_message("SequencerError",
                              PyUnicode_FromFormat("step(): a replay of journal %R offsets [%S,"
                                                   " %S) must be started with start_replay()"
                                                   " first (queue outcome was"
                                                   " ACK_COMMIT_REPLAY)",
                                                   PyTuple_GET_ITEM(range, 0),
                                                   PyTuple_GET_ITEM(range, 1),
                                                   PyTuple_GET_ITEM(range, 2)));
            Py_XDECREF(range);
            goto error;
        }
    } else {
        emit->min_clock = k->dequeued_clock; /* the dequeued envelope was processed */
    }
    while (start != -1) {
        PyObject *env;
        uint64_t clock;
        long flags;
        long long begin;
        if (k->replay_it == NULL) {
            env = k->ring[start];
            if (env == NULL) { /* a chain links only slots step() has not taken yet */
                raise_message("SequencerError",
                              PyUnicode_FromFormat("ring invariant violated for journal %R"
                                                   " (slot %zd stepped through twice)",
                                                   emit->journal, start));
                goto error;
            }
            Py_ssize_t age = k->head - start;
            if (age <= 0)
                age += k->size;
            if (age <= DELIVERED_RECENT) {
                k->ring[start] = NULL; /* its reference moves to the delivered queue */
                delivered_push(k, env);
            }
            Py_INCREF(env);
            clock = k->rclock[start];
            flags = k->rflags[start];
            begin = k->rbegin[start];
            start = emit->ring_start = k->next[start];
        } else {
            env = PyIter_Next(k->replay_it);
            if (env == NULL) {
                if (PyErr_Occurred())
                    goto error;
                Py_CLEAR(k->replay_it); /* replay drained: carry on from the ring */
                continue;
            }
            if (check_replayed(k, env, emit, &begin) < 0) {
                Py_DECREF(env);
                goto error;
            }
            PyObject *ids = env_ids(k, env, &clock, &flags);
            if (ids == NULL) {
                Py_DECREF(env);
                goto error;
            }
            int same = PyObject_RichCompareBool(PyTuple_GET_ITEM(ids, 0), emit->producer, Py_EQ);
            Py_DECREF(ids);
            if (same <= 0 || clock == 0) {
                Py_DECREF(env);
                if (same < 0)
                    goto error;
                /* Another producer's message, interleaved in the journal; or a zero clock,
                 * which commits at once (delivered when first queued). */
                continue;
            }
        }
        Py_XSETREF(k->dequeued, env);
        k->dequeued_clock = clock;
        if (clock && clock <= emit->min_clock)
            continue; /* a duplicate (from the ring, a replay, or across a checkpoint) */
        if (clock > emit->max_clock)
            continue; /* larger than the committing ACK: not committed */
        emit->begin = begin;
        *flags_out = flags;
        Py_DECREF(emit);
        return Py_NewRef(env);
    }
    /* Drained. Offsets were held back when the commit was queued: move them now. */
    if (k->dequeued != NULL && set_offset(k, emit->journal, k->dequeued) < 0)
        goto error;
    emit->max_clock = emit->min_clock;
    emit->begin = emit->ring_start = emit->ring_stop = -1;
    pending_discard(k, emit);
    Py_CLEAR(k->emit);
    Py_CLEAR(k->dequeued);
    k->dequeued_clock = 0;
    Py_DECREF(emit);
    return NULL;
error:
    Py_DECREF(emit);
    return NULL;
}

/* ---- Kernel: construction, GC */

static PyObject *
kernel_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"offsets", "states", "buffer", "warn", "max_bytes", NULL};
    PyObject *offsets, *states, *warn_cb;
    Py_ssize_t buffer;
    long long max_bytes = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "O!OnO|L:Kernel", kwlist, &PyDict_Type,
                                     &offsets, &states, &buffer, &warn_cb, &max_bytes))
        return NULL;
    if (max_bytes < 0) {
        PyErr_SetString(PyExc_ValueError, "Kernel(): max_bytes must not be negative");
        return NULL;
    }
    if (!PyCallable_Check(warn_cb)) {
        PyErr_SetString(PyExc_TypeError, "Kernel(): warn must be callable");
        return NULL;
    }
    ModState *st = PyType_GetModuleState(type);
    if (st == NULL)
        return NULL;
    KernelObj *k = (KernelObj *)type->tp_alloc(type, 0);
    if (k == NULL)
        return NULL;
    k->st = st;
    k->size = buffer < 1 ? 1 : buffer;
    k->head = 0;
    k->max_bytes = max_bytes;
    k->may_grow = max_bytes > 0;
    k->warn = Py_NewRef(warn_cb);
    k->ring = PyMem_Calloc((size_t)k->size, sizeof(PyObject *));
    k->next = PyMem_Calloc((size_t)k->size, sizeof(Py_ssize_t));
    k->owner = PyMem_Calloc((size_t)k->size, sizeof(PartialObj *));
    k->rbegin = PyMem_Calloc((size_t)k->size, sizeof(long long));
    k->rend = PyMem_Calloc((size_t)k->size, sizeof(long long));
    k->rclock = PyMem_Calloc((size_t)k->size, sizeof(uint64_t));
    k->rflags = PyMem_Calloc((size_t)k->size, sizeof(long));
    k->delivered = PyMem_Calloc((size_t)k->size, sizeof(PyObject *));
    k->offsets = PyDict_Copy(offsets);
    k->partials = PyDict_New();
    if (k->ring == NULL || k->next == NULL || k->owner == NULL || k->rbegin == NULL ||
        k->rend == NULL || k->rclock == NULL || k->rflags == NULL || k->delivered == NULL) {
        PyErr_NoMemory();
        goto fail;
    }
    if (k->offsets == NULL || k->partials == NULL)
        goto fail;
    for (Py_ssize_t i = 0; i < k->size; i++)
        k->next[i] = -1;
    PyObject *it = PyObject_GetIter(states);
    if (it == NULL)
        goto fail;
    PyObject *s;
    while ((s = PyIter_Next(it)) != NULL) {
        PyObject *journal, *producer;
        unsigned long long last_ack;
        long long begin;
        if (!PyArg_ParseTuple(s, "UO!KL:Kernel state", &journal, &PyBytes_Type, &producer,
                              &last_ack, &begin)) {
            Py_DECREF(s);
            Py_DECREF(it);
            goto fail;
        }
        PartialObj *p = partial_new(st, journal, producer, last_ack, begin, 0);
        int rc = p != NULL ? track(k, journal, p) : -1;
        Py_XDECREF(p);
        Py_DECREF(s);
        if (rc < 0) {
            Py_DECREF(it);
            goto fail;
        }
    }
    Py_DECREF(it);
    if (PyErr_Occurred())
        goto fail;
    return (PyObject *)k;
fail:
    Py_DECREF(k);
    return NULL;
}

static int
kernel_traverse(KernelObj *k, visitproc visit, void *arg)
{
    Py_VISIT(Py_TYPE(k));
    if (k->ring != NULL)
        for (Py_ssize_t i = 0; i < k->size; i++)
            Py_VISIT(k->ring[i]);
    if (k->delivered != NULL)
        for (Py_ssize_t j = 0; j < k->delivered_n; j++)
            Py_VISIT(k->delivered[(k->delivered_head + j) % k->size]);
    Py_VISIT(k->offsets);
    Py_VISIT(k->off_journal);
    Py_VISIT(k->off_env);
    Py_VISIT(k->partials);
    Py_VISIT(k->cur_journal);
    Py_VISIT(k->cur_bp);
    Py_VISIT(k->dequeued);
    Py_VISIT(k->replay_it);
    Py_VISIT(k->warn);
    return cache_traverse(&k->cache, visit, arg);
}

static int
kernel_clear(KernelObj *k)
{
    if (k->ring != NULL)
        for (Py_ssize_t i = 0; i < k->size; i++)
            Py_CLEAR(k->ring[i]);
    if (k->delivered != NULL)
        while (k->delivered_n > 0)
            delivered_drop(k);
    if (k->owner != NULL)
        for (Py_ssize_t i = 0; i < k->size; i++)
            Py_CLEAR(k->owner[i]);
    Py_CLEAR(k->offsets);
    Py_CLEAR(k->off_journal);
    Py_CLEAR(k->off_env);
    Py_CLEAR(k->partials);
    Py_CLEAR(k->cur_journal);
    Py_CLEAR(k->cur_bp);
    Py_CLEAR(k->emit);
    Py_CLEAR(k->dequeued);
    Py_CLEAR(k->replay_it);
    Py_CLEAR(k->warn);
    cache_clear(&k->cache);
    return 0;
}

static void
kernel_dealloc(KernelObj *k)
{
    PyTypeObject *type = Py_TYPE(k);
    PyObject_GC_UnTrack(k);
    kernel_clear(k);
    PyMem_Free(k->ring);
    PyMem_Free(k->next);
    PyMem_Free(k->owner);
    PyMem_Free(k->rbegin);
    PyMem_Free(k->rend);
    PyMem_Free(k->rclock);
    PyMem_Free(k->rflags);
    PyMem_Free(k->delivered);
    type->tp_free((PyObject *)k);
    Py_DECREF(type);
}

/* ---- Kernel: methods */

static PyObject *
kernel_queue_uncommitted(KernelObj *k, PyObject *env)
{
    int outcome = kqueue(k, env);
    return outcome < 0 ? NULL : PyLong_FromLong(outcome);
}

static PyObject *
kernel_decide(KernelObj *k, PyObject *env)
{
    uint64_t clock;
    long flags;
    PyObject *ids = env_ids(k, env, &clock, &flags);
    if (ids == NULL)
        return NULL;
    PyObject *journal = env_get(k, env, F_JOURNAL);
    if (journal == NULL) {
        Py_DECREF(ids);
        return NULL;
    }
    PartialObj *p = NULL;
    int outcome = decide(k, journal, PyTuple_GET_ITEM(ids, 0), clock, flags, &p);
    Py_DECREF(journal);
    Py_DECREF(ids);
    if (outcome < 0)
        return NULL;
    PyObject *state = partial_state(p);
    Py_DECREF(p);
    return state != NULL ? Py_BuildValue("(iN)", outcome, state) : NULL;
}

static PyObject *
kernel_step(KernelObj *k, PyObject *unused)
{
    long flags;
    PyObject *env = kstep(k, &flags);
    if (env == NULL && !PyErr_Occurred())
        Py_RETURN_NONE;
    return env;
}

static PyObject *
kernel_replay_range(KernelObj *k, PyObject *unused)
{
    return replay_range(k);
}

static PyObject *
kernel_start_replay(KernelObj *k, PyObject *envelopes)
{
    if (k->emit == NULL) {
        raise_message("SequencerError",
                      PyUnicode_FromString("start_replay(): no committed messages to step through"));
        return NULL;
    }
    PyObject *it = PyObject_GetIter(envelopes);
    if (it == NULL)
        return NULL;
    Py_XSETREF(k->replay_it, it);
    Py_RETURN_NONE;
}

static PyObject *
kernel_offsets(KernelObj *k, PyObject *unused)
{
    if (flush_offset(k) < 0)
        return NULL;
    return PyDict_Copy(k->offsets);
}

static PyObject *
kernel_has_pending(KernelObj *k, PyObject *unused)
{
    return PyBool_FromLong(k->npending > 0);
}

/* checkpoint(prune_below, dequeued_processed): (offsets, [(journal, producer, last_ack,
 * begin)]) in table order; producers with max_clock < (newest last_ack in their journal) -
 * prune_below are forgotten (prune_below -1: none). Clears the pending transactions. */
static PyObject *
kernel_checkpoint(KernelObj *k, PyObject *args)
{
    long long delta;
    int processed;
    if (!PyArg_ParseTuple(args, "Lp:checkpoint", &delta, &processed))
        return NULL;
    if (flush_offset(k) < 0)
        return NULL;
    PyObject *states = PyList_New(0);
    PyObject *journals = PyDict_Keys(k->partials);
    PyObject *stale = PyList_New(0);
    if (states == NULL || journals == NULL || stale == NULL)
        goto fail;
    PartialObj *emit = k->emit;
    int last = 0;
    uint64_t dclock = k->dequeued_clock;
    int done = processed && k->dequeued != NULL && emit != NULL;
    if (done)
        last = emit->ring_start == -1 && k->replay_it == NULL;
    for (Py_ssize_t j = 0; j < PyList_GET_SIZE(journals); j++) {
        PyObject *journal = PyList_GET_ITEM(journals, j);
        PyObject *bp = PyDict_GetItemWithError(k->partials, journal);
        if (bp == NULL)
            goto fail;
        Py_ssize_t pos = 0;
        PyObject *key, *value;
        uint64_t newest = 0;
        while (PyDict_Next(bp, &pos, &key, &value)) {
            PartialObj *p = (PartialObj *)value;
            p->pending = 0;
            if (p->min_clock > newest)
                newest = p->min_clock;
        }
        if (delta >= 0 && PyDict_GET_SIZE(bp) > 0 && (uint64_t)delta < newest) {
            /* The bound is newest - delta: at or below 0, nothing is older. */
            uint64_t bound = newest - (uint64_t)delta;
            pos = 0;
            while (PyDict_Next(bp, &pos, &key, &value))
                if (((PartialObj *)value)->max_clock < bound && PyList_Append(stale, key) < 0)
                    goto fail;
            for (Py_ssize_t i = 0; i < PyList_GET_SIZE(stale); i++) {
                PyObject *producer = PyList_GET_ITEM(stale, i);
                PartialObj *p = (PartialObj *)PyDict_GetItemWithError(bp, producer);
                if (p == NULL)
                    goto fail;
                p->tracked = 0;
                if (PyDict_DelItem(bp, producer) < 0)
                    goto fail;
            }
            if (PyList_SetSlice(stale, 0, PyList_GET_SIZE(stale), NULL) < 0)
                goto fail;
        }
        pos = 0;
        while (PyDict_Next(bp, &pos, &key, &value)) {
            PartialObj *p = (PartialObj *)value;
            uint64_t ack = p->min_clock;
            long long begin = p->begin;
            if (done && dclock && p == emit) {
                ack = dclock;
                begin = last ? -1 : emit->begin;
            }
            PyObject *s = Py_BuildValue("(OOKL)", journal, key, (unsigned long long)ack, begin);
            if (s == NULL || PyList_Append(states, s) < 0) {
                Py_XDECREF(s);
                goto fail;
            }
            Py_DECREF(s);
        }
    }
    k->npending = 0;
    PyObject *offsets = PyDict_Copy(k->offsets);
    if (offsets == NULL)
        goto fail;
    if (done && last) {
        PyObject *end = env_get(k, k->dequeued, F_END);
        if (end == NULL || PyDict_SetItem(offsets, emit->journal, end) < 0) {
            Py_XDECREF(end);
            Py_DECREF(offsets);
            goto fail;
        }
        Py_DECREF(end);
    }
    Py_DECREF(journals);
    Py_DECREF(stale);
    return Py_BuildValue("(NN)", offsets, states);
fail:
    Py_XDECREF(states);
    Py_XDECREF(journals);
    Py_XDECREF(stale);
    return NULL;
}

static PyObject *
kernel_sequence(KernelObj *k, PyObject *args)
{
    PyObject *envelopes, *replay;
    int acks;
    if (!PyArg_ParseTuple(args, "OOp:sequence", &envelopes, &replay, &acks))
        return NULL;
    PyObject *it = PyObject_GetIter(envelopes);
    if (it == NULL)
        return NULL;
    SeqIterObj *s = PyObject_GC_New(SeqIterObj, k->st->seqiter_type);
    if (s == NULL) {
        Py_DECREF(it);
        return NULL;
    }
    s->k = (KernelObj *)Py_NewRef(k);
    s->it = it;
    s->replay = Py_NewRef(replay);
    s->acks = acks;
    s->state = IT_TOP;
    s->last = NULL;
    PyObject_GC_Track(s);
    return (PyObject *)s;
}

/* Introspection, for tests: the ring (a slot step() took its envelope from shows None),
 * a producer's record, the committed sequence. */
static PyObject *
kernel_ring(KernelObj *k, PyObject *unused)
{
    PyObject *ring = PyList_New(k->size), *next = PyList_New(k->size);
    if (ring == NULL || next == NULL)
        goto fail;
    for (Py_ssize_t i = 0; i < k->size; i++) {
        PyList_SET_ITEM(ring, i, Py_NewRef(k->ring[i] != NULL ? k->ring[i] : Py_None));
        PyObject *n = PyLong_FromSsize_t(k->next[i]);
        if (n == NULL)
            goto fail;
        PyList_SET_ITEM(next, i, n);
    }
    return Py_BuildValue("(NNn)", ring, next, k->head);
fail:
    Py_XDECREF(ring);
    Py_XDECREF(next);
    return NULL;
}

static PyObject *
kernel_partials(KernelObj *k, PyObject *journal)
{
    PyObject *out = PyDict_New();
    PyObject *bp = out != NULL ? PyDict_GetItemWithError(k->partials, journal) : NULL;
    if (bp == NULL) {
        if (PyErr_Occurred())
            Py_CLEAR(out);
        return out;
    }
    Py_ssize_t pos = 0;
    PyObject *key, *value;
    while (PyDict_Next(bp, &pos, &key, &value)) {
        PyObject *s = partial_state((PartialObj *)value);
        if (s == NULL || PyDict_SetItem(out, key, s) < 0) {
            Py_XDECREF(s);
            Py_DECREF(out);
            return NULL;
        }
        Py_DECREF(s);
    }
    return out;
}

static PyObject *
kernel_emitting(KernelObj *k, PyObject *unused)
{
    if (k->emit == NULL)
        Py_RETURN_NONE;
    return partial_state(k->emit);
}

static PyObject *
kernel_pending(KernelObj *k, PyObject *unused)
{
    return PyLong_FromSsize_t(k->npending);
}

static PyObject *
kernel_producers(KernelObj *k, PyObject *unused)
{
    Py_ssize_t n = 0, pos = 0;
    PyObject *key, *value;
    while (PyDict_Next(k->partials, &pos, &key, &value))
        n += PyDict_GET_SIZE(value);
    return PyLong_FromSsize_t(n);
}

static PyObject *
kernel_get_dequeued(KernelObj *k, void *unused)
{
    return Py_NewRef(k->dequeued != NULL ? k->dequeued : Py_None);
}

static PyObject *
kernel_get_buffer(KernelObj *k, void *unused)
{
    return PyLong_FromSsize_t(k->size);
}

static PyObject *
kernel_get_stepping(KernelObj *k, void *unused)
{
    return PyBool_FromLong(k->emit != NULL);
}

static PyMethodDef kernel_methods[] = {
    {"queue_uncommitted", (PyCFunction)kernel_queue_uncommitted, METH_O,
     "Evict the head, decide, apply: the outcome's index in OUTCOMES."},
    {"decide", (PyCFunction)kernel_decide, METH_O,
     "(outcome index, partial state) of queueing env next; changes nothing."},
    {"step", (PyCFunction)kernel_step, METH_NOARGS,
     "The next committed envelope, or None once the committed sequence is drained."},
    {"replay_range", (PyCFunction)kernel_replay_range, METH_NOARGS,
     "(journal, begin, end) to replay before stepping on."},
    {"start_replay", (PyCFunction)kernel_start_replay, METH_O,
     "Supply the envelopes of replay_range(), then step() on."},
    {"offsets", (PyCFunction)kernel_offsets, METH_NOARGS, "A copy of the read-through offsets."},
    {"has_pending", (PyCFunction)kernel_has_pending, METH_NOARGS,
     "True if a transaction begun since the last checkpoint is still open."},
    {"checkpoint", (PyCFunction)kernel_checkpoint, METH_VARARGS,
     "checkpoint(prune_below, dequeued_processed) -> (offsets, state tuples)."},
    {"sequence", (PyCFunction)kernel_sequence, METH_VARARGS,
     "sequence(envelopes, replay, acks) -> iterator of committed envelopes."},
    {"ring", (PyCFunction)kernel_ring, METH_NOARGS, "(envelopes, next links, head), for tests."},
    {"partials", (PyCFunction)kernel_partials, METH_O,
     "producer -> partial state of a journal, for tests."},
    {"emitting", (PyCFunction)kernel_emitting, METH_NOARGS,
     "The partial state of the sequence being stepped through, or None."},
    {"pending", (PyCFunction)kernel_pending, METH_NOARGS,
     "How many transactions begun since the last checkpoint are open."},
    {"producers", (PyCFunction)kernel_producers, METH_NOARGS, "How many producers are tracked."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef kernel_getset[] = {
    {"dequeued", (getter)kernel_get_dequeued, NULL, "The envelope step() last returned.", NULL},
    {"buffer", (getter)kernel_get_buffer, NULL, "The ring's size.", NULL},
    {"stepping", (getter)kernel_get_stepping, NULL, "A committed sequence is being stepped.",
     NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyType_Slot kernel_slots[] = {
    {Py_tp_new, kernel_new},
    {Py_tp_dealloc, kernel_dealloc},
    {Py_tp_traverse, kernel_traverse},
    {Py_tp_clear, kernel_clear},
    {Py_tp_methods, kernel_methods},
    {Py_tp_getset, kernel_getset},
    {Py_tp_doc, "Kernel(offsets, states, buffer, warn, max_bytes=0): SequencingKernel in C (see"
                " oncelog/sequencer.py)."},
    {0, NULL},
};

static PyType_Spec kernel_spec = {
    .name = "oncelog._speedups.Kernel",
    .basicsize = sizeof(KernelObj),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_IMMUTABLETYPE,
    .slots = kernel_slots,
};

/* ---- the sequence() iterator: queue, then step, per envelope */

static PyObject *
seqiter_fail(SeqIterObj *s)
{
    s->state = IT_DONE;
    Py_CLEAR(s->last);
    return NULL;
}

static PyObject *
seqiter_next(SeqIterObj *s)
{
    KernelObj *k = s->k;
    long flags;
    PyObject *c;
    if (s->state == IT_DONE)
        return NULL;
    if (s->state == IT_STEPPING) {
        if (k->dequeued != s->last) {
            raise_message("SequencerError",
                          PyUnicode_FromString("sequence(): the sequencer was stepped while this"
                                               " iterator was suspended; it stops here (carry"
                                               " on with step())"));
            return seqiter_fail(s);
        }
        goto stepping;
    }
    for (;;) {
        PyObject *env = PyIter_Next(s->it);
        if (env == NULL) {
            s->state = IT_DONE; /* the end, or the iterator's error */
            return NULL;
        }
        int outcome = kqueue(k, env);
        Py_DECREF(env);
        if (outcome < 0)
            return seqiter_fail(s);
        if (k->emit == NULL)
            continue;
        if (outcome == O_ACK_COMMIT_REPLAY) {
            PyObject *range = replay_range(k);
            if (range == NULL)
                return seqiter_fail(s);
            if (s->replay == Py_None) {
                raise_sequencer_error("ReplayRequired", range);
                return seqiter_fail(s);
            }
            PyObject *r = PyObject_CallObject(s->replay, range);
            Py_DECREF(range);
            PyObject *it = r != NULL ? PyObject_GetIter(r) : NULL;
            Py_XDECREF(r);
            if (it == NULL)
                return seqiter_fail(s);
            Py_XSETREF(k->replay_it, it);
        }
        s->state = IT_STEPPING;
    stepping:
        while ((c = kstep(k, &flags)) != NULL) {
            if (!s->acks && flags == ACK_TXN) {
                Py_DECREF(c);
                continue;
            }
            Py_XSETREF(s->last, Py_NewRef(c));
            return c;
        }
        if (PyErr_Occurred())
            return seqiter_fail(s);
        s->state = IT_TOP;
        Py_CLEAR(s->last);
    }
}

static PyObject *
seqiter_close(SeqIterObj *s, PyObject *unused)
{
    s->state = IT_DONE;
    Py_CLEAR(s->last);
    Py_RETURN_NONE;
}

static int
seqiter_traverse(SeqIterObj *s, visitproc visit, void *arg)
{
    Py_VISIT(Py_TYPE(s));
    Py_VISIT(s->k);
    Py_VISIT(s->it);
    Py_VISIT(s->replay);
    Py_VISIT(s->last);
    return 0;
}

static int
seqiter_clear(SeqIterObj *s)
{
    Py_CLEAR(s->k);
    Py_CLEAR(s->it);
    Py_CLEAR(s->replay);
    Py_CLEAR(s->last);
    return 0;
}

static void
seqiter_dealloc(SeqIterObj *s)
{
    PyTypeObject *type = Py_TYPE(s);
    PyObject_GC_UnTrack(s);
    seqiter_clear(s);
    PyObject_GC_Del(s);
    Py_DECREF(type);
}

static PyMethodDef seqiter_methods[] = {
    {"close", (PyCFunction)seqiter_close, METH_NOARGS, "Stop sequencing."},
    {NULL, NULL, 0, NULL},
};

static PyType_Slot seqiter_slots[] = {
    {Py_tp_dealloc, seqiter_dealloc},
    {Py_tp_traverse, seqiter_traverse},
    {Py_tp_clear, seqiter_clear},
    {Py_tp_iter, PyObject_SelfIter},
    {Py_tp_iternext, seqiter_next},
    {Py_tp_methods, seqiter_methods},
    {Py_tp_doc, "Kernel.sequence(): queue_uncommitted then step per envelope, in C."},
    {0, NULL},
};

static PyType_Spec seqiter_spec = {
    .name = "oncelog._speedups.SequenceIterator",
    .basicsize = sizeof(SeqIterObj),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_IMMUTABLETYPE |
             Py_TPFLAGS_DISALLOW_INSTANTIATION,
    .slots = seqiter_slots,
};

/* --------------------------------------------------------------------------------------
 * Decoder */

#define PRODUCER_CACHE 1024 /* 512 sets of two ways: (v * golden) >> 55 picks a set */
enum { E_JOURNAL, E_BEGIN, E_END, E_MESSAGE, E_IDS, E_N };
enum { M_DOC, M_UUID_FIELD, M_N };
enum { L_LINE, L_UUID_FIELD, L_JOURNAL, L_BEGIN, L_N };

typedef struct {
    PyObject_HEAD
    PyTypeObject *env_type, *msg_type, *line_type; /* line_type: NULL if not given */
    newfunc env_new, msg_new, line_new;            /* NULL: object's (allocation alone) */
    allocfunc env_alloc, msg_alloc, line_alloc;
    PyObject *env_names[E_N], *msg_names[M_N], *line_names[L_N];
    AttrCache env_attrs, msg_attrs, line_attrs;
    PyObject *loads, *flag_values, *nil_fields, *no_args;
    /* Producer IDs: one shared bytes object per node value (a small direct-mapped cache). */
    unsigned long long cache_node[PRODUCER_CACHE];
    PyObject *cache_bytes[PRODUCER_CACHE];
} DecoderObj;

static int
decoder_traverse(DecoderObj *d, visitproc visit, void *arg)
{
    Py_VISIT(Py_TYPE(d));
    Py_VISIT(d->env_type);
    Py_VISIT(d->msg_type);
    Py_VISIT(d->line_type);
    Py_VISIT(d->loads);
    Py_VISIT(d->flag_values);
    Py_VISIT(d->nil_fields);
    int r = cache_traverse(&d->env_attrs, visit, arg);
    r = r != 0 ? r : cache_traverse(&d->line_attrs, visit, arg);
    return r != 0 ? r : cache_traverse(&d->msg_attrs, visit, arg);
}

static int
decoder_clear(DecoderObj *d)
{
    Py_CLEAR(d->env_type);
    Py_CLEAR(d->msg_type);
    Py_CLEAR(d->line_type);
    Py_CLEAR(d->loads);
    Py_CLEAR(d->flag_values);
    Py_CLEAR(d->nil_fields);
    Py_CLEAR(d->no_args);
    for (int i = 0; i < E_N; i++)
        Py_CLEAR(d->env_names[i]);
    for (int i = 0; i < M_N; i++)
        Py_CLEAR(d->msg_names[i]);
    for (int i = 0; i < L_N; i++)
        Py_CLEAR(d->line_names[i]);
    cache_clear(&d->env_attrs);
    cache_clear(&d->msg_attrs);
    cache_clear(&d->line_attrs);
    for (int i = 0; i < PRODUCER_CACHE; i++)
        Py_CLEAR(d->cache_bytes[i]);
    return 0;
}

static void
decoder_dealloc(DecoderObj *d)
{
    PyTypeObject *type = Py_TYPE(d);
    PyObject_GC_UnTrack(d);
    decoder_clear(d);
    type->tp_free((PyObject *)d);
    Py_DECREF(type);
}

static int
decoder_class(PyObject *cls, const char *const *names, int n, PyObject **interned,
              AttrCache *attrs, newfunc *new_out, allocfunc *alloc_out)
{
    if (!PyType_Check(cls)) {
        PyErr_SetString(PyExc_TypeError, "Decoder() needs classes");
        return -1;
    }
    for (int i = 0; i < n; i++)
        if ((interned[i] = PyUnicode_InternFromString(names[i])) == NULL)
            return -1;
    PyTypeObject *type = (PyTypeObject *)cls;
    if (cache_fill(attrs, type, interned, n) < 0)
        return -1;
    for (int i = 0; i < n; i++)
        if (attrs->set[i] == NULL) {
            PyErr_Format(PyExc_TypeError, "%s.%s must be a slot (or another data descriptor)",
                         type->tp_name, names[i]);
            return -1;
        }
    newfunc new = (newfunc)PyType_GetSlot(type, Py_tp_new);
    if (new == NULL || (PyType_GetFlags(type) & Py_TPFLAGS_IS_ABSTRACT)) {
        PyErr_Format(PyExc_TypeError, "%s cannot be instantiated", type->tp_name);
        return -1;
    }
    /* object.__new__ checks its arguments and abstract methods (done above), then
     * allocates: take the allocation alone (NULL) when the class has no __new__ of its own. */
    *new_out = new == (newfunc)PyType_GetSlot(&PyBaseObject_Type, Py_tp_new) ? NULL : new;
    *alloc_out = (allocfunc)PyType_GetSlot(type, Py_tp_alloc);
    if (*new_out == NULL && *alloc_out == NULL) {
        PyErr_Format(PyExc_TypeError, "%s has no allocator", type->tp_name);
        return -1;
    }
    return 0;
}

static PyObject *
decoder_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    static const char *const env_names[E_N] = {"journal", "begin", "end", "message", "_ids"};
    static const char *const msg_names[M_N] = {"doc", "uuid_field"};
    static const char *const line_names[L_N] = {"line", "uuid_field", "journal", "begin"};
    PyObject *envelope, *message, *loads, *flags, *nil, *line = Py_None;
    if (kwds != NULL && PyDict_GET_SIZE(kwds) != 0) {
        PyErr_SetString(PyExc_TypeError, "Decoder() takes no keyword arguments");
        return NULL;
    }
    if (!PyArg_ParseTuple(args, "OOOO!O!|O:Decoder", &envelope, &message, &loads, &PyTuple_Type,
                          &flags, &PyTuple_Type, &nil, &line))
        return NULL;
    if (PyTuple_GET_SIZE(flags) != FLAGS_MASK + 1) {
        PyErr_Format(PyExc_ValueError, "Decoder() needs the %d flag values", FLAGS_MASK + 1);
        return NULL;
    }
    DecoderObj *d = (DecoderObj *)type->tp_alloc(type, 0);
    if (d == NULL)
        return NULL;
    if (decoder_class(envelope, env_names, E_N, d->env_names, &d->env_attrs, &d->env_new,
                      &d->env_alloc) < 0 ||
        decoder_class(message, msg_names, M_N, d->msg_names, &d->msg_attrs, &d->msg_new,
                      &d->msg_alloc) < 0 ||
        (line != Py_None && decoder_class(line, line_names, L_N, d->line_names, &d->line_attrs,
                                          &d->line_new, &d->line_alloc) < 0) ||
        (d->no_args = PyTuple_New(0)) == NULL) {
        Py_DECREF(d);
        return NULL;
    }
    if (line != Py_None)
        d->line_type = (PyTypeObject *)Py_NewRef(line);
    d->env_type = (PyTypeObject *)Py_NewRef(envelope);
    d->msg_type = (PyTypeObject *)Py_NewRef(message);
    d->loads = Py_NewRef(loads);
    d->flag_values = Py_NewRef(flags);
    d->nil_fields = Py_NewRef(nil);
    return (PyObject *)d;
}

/* A new instance of a class, made by its __new__ (none of its own: object's, which is the
 * allocation alone). */
static inline PyObject *
make(DecoderObj *d, PyTypeObject *type, newfunc new, allocfunc alloc)
{
    return new != NULL ? new(type, d->no_args, NULL) : alloc(type, 0);
}

/* Set attribute i of a new instance through its data descriptor (checked when the Decoder
 * was made), as setattr would; a new reference to value is taken. A slot of the cached
 * type is stored into directly (what its descriptor's __set__ does). */
static inline int
attr_set(AttrCache *c, int i, PyObject *obj, PyObject *value)
{
    if (c->offset[i] >= 0 && Py_IS_TYPE(obj, c->type)) {
        PyObject **slot = (PyObject **)((char *)obj + c->offset[i]);
        Py_XSETREF(*slot, Py_NewRef(value));
        return 0;
    }
    return c->set[i](c->descr[i], obj, value);
}
#define SET(attrs, i, obj, value) attr_set((attrs), (i), (obj), (value))

/* Append to `out` a new Envelope of these attributes (references borrowed); -1 on error. */
static int
append_envelope(DecoderObj *d, PyObject *out, PyObject *journal, PyObject *begin,
                PyObject *end, PyObject *msg, PyObject *ids)
{
    PyObject *env = make(d, d->env_type, d->env_new, d->env_alloc);
    int bad = env == NULL || SET(&d->env_attrs, E_JOURNAL, env, journal) < 0 ||
              SET(&d->env_attrs, E_BEGIN, env, begin) < 0 ||
              SET(&d->env_attrs, E_END, env, end) < 0 ||
              SET(&d->env_attrs, E_MESSAGE, env, msg) < 0 ||
              SET(&d->env_attrs, E_IDS, env, ids) < 0 || PyList_Append(out, env) < 0;
    Py_XDECREF(env);
    return bad ? -1 : 0;
}


/* Byte values of two hex digits, indexed by the digits' two bytes (first << 8 | second);
 * 0x100 marks a pair that is not two hex digits. A constant table, built by the compiler. */
#define HV(c) ((c) >= '0' && (c) <= '9'   ? (c) - '0'                                          \
               : (c) >= 'a' && (c) <= 'f' ? (c) - 'a' + 10                                     \
               : (c) >= 'A' && (c) <= 'F' ? (c) - 'A' + 10                                     \
                                          : -1)
#define HX(h, l) (HV(h) < 0 || HV(l) < 0 ? 0x100 : (HV(h) << 4 | HV(l)))
#define HX4(h, l) HX(h, l), HX(h, l + 1), HX(h, l + 2), HX(h, l + 3)
#define HX16(h, l) HX4(h, l), HX4(h, l + 4), HX4(h, l + 8), HX4(h, l + 12)
#define HX64(h, l) HX16(h, l), HX16(h, l + 16), HX16(h, l + 32), HX16(h, l + 48)
#define HXROW(h) HX64(h, 0), HX64(h, 64), HX64(h, 128), HX64(h, 192)
#define HXROW4(h) HXROW(h), HXROW(h + 1), HXROW(h + 2), HXROW(h + 3)
#define HXROW16(h) HXROW4(h), HXROW4(h + 4), HXROW4(h + 8), HXROW4(h + 12)
#define HXROW64(h) HXROW16(h), HXROW16(h + 16), HXROW16(h + 32), HXROW16(h + 48)
static const unsigned short HEX2[1 << 16] = {
    HXROW64(0), HXROW64(64), HXROW64(128), HXROW64(192),
};

/* Where the 16 digit pairs of a canonical UUID string start (dashes at 8, 13, 18 and 23). */
static const unsigned char PAIR_AT[16] = {
    0, 2, 4, 6, 9, 11, 14, 16, 19, 21, 24, 26, 28, 30, 32, 34,
};

/* The 16 bytes of the canonical UUID text at s (36 bytes); 0 if it is not one. */
static int
uuid_text_bytes(const unsigned char *s, unsigned char out[16])
{
    if (s[8] != '-' || s[13] != '-' || s[18] != '-' || s[23] != '-')
        return 0;
    unsigned int bad = 0;
    for (int i = 0; i < 16; i++) {
        const unsigned char *d = s + PAIR_AT[i];
        unsigned int v = HEX2[d[0] << 8 | d[1]];
        bad |= v;
        out[i] = (unsigned char)v;
    }
    return !(bad & 0x100);
}

/* The 16 bytes of a canonical 36-character UUID string; 0 if it is not one. */
static int
uuid_bytes(PyObject *text, unsigned char out[16])
{
    if (!PyUnicode_Check(text) || PyUnicode_GET_LENGTH(text) != 36 ||
        PyUnicode_KIND(text) != PyUnicode_1BYTE_KIND)
        return 0;
    return uuid_text_bytes(PyUnicode_1BYTE_DATA(text), out);
}

/* The shared bytes object of a producer ID. The cache is two-way set associative over
 * Fibonacci hashing of the 48-bit value: producer IDs that differ in a single byte (IDs
 * handed out in sequence) spread over the sets instead of colliding in pairs, and two IDs
 * that do share a set both stay cached. A miss makes a new object, which costs its
 * allocation and, in every dict it is looked up in, a hash and a comparison. */
static PyObject *
producer_bytes(DecoderObj *d, const unsigned char *node)
{
    unsigned long long v = 0;
    for (int i = 0; i < PRODUCER_ID_LEN; i++)
        v = (v << 8) | node[i];
    size_t slot = (size_t)((v * 0x9E3779B97F4A7C15ULL) >> 55) << 1; /* the set's first way */
    if (d->cache_bytes[slot] != NULL && d->cache_node[slot] == v)
        return Py_NewRef(d->cache_bytes[slot]);
    if (d->cache_bytes[slot + 1] != NULL && d->cache_node[slot + 1] == v)
        return Py_NewRef(d->cache_bytes[slot + 1]);
    PyObject *b = PyBytes_FromStringAndSize((const char *)node, PRODUCER_ID_LEN);
    if (b == NULL)
        return NULL;
    /* The first way keeps the newest; the one it held moves to the second. */
    Py_XSETREF(d->cache_bytes[slot + 1], d->cache_bytes[slot]);
    d->cache_node[slot + 1] = d->cache_node[slot];
    d->cache_bytes[slot] = Py_NewRef(b);
    d->cache_node[slot] = v;
    return b;
}

static PyObject *ids_of_bytes(DecoderObj *d, const unsigned char b[16]);

/* (producer, clock, flags) of a UUID value (a new reference); None when the value is left
 * for lazy parsing; NULL with an error set on failure. */
static PyObject *
ids_of(DecoderObj *d, PyObject *value)
{
    if (value == NULL || value == Py_None ||
        (PyUnicode_Check(value) && PyUnicode_GET_LENGTH(value) == 0))
        return Py_NewRef(d->nil_fields);
    unsigned char b[16];
    if (!uuid_bytes(value, b))
        Py_RETURN_NONE;
    return ids_of_bytes(d, b);
}

/* (producer, clock, flags) of the 16 bytes of a UUID (a new reference). */
static PyObject *
ids_of_bytes(DecoderObj *d, const unsigned char b[16])
{
    unsigned long long hi = ((unsigned long long)(((b[6] << 8) | b[7]) & TIME_HI_MASK));
    unsigned long long mid = ((unsigned long long)b[4] << 8) | b[5];
    unsigned long long low = ((unsigned long long)b[0] << 24) | ((unsigned long long)b[1] << 16) |
                             ((unsigned long long)b[2] << 8) | b[3];
    unsigned int seq = ((unsigned int)b[CLOCK_SEQ_BYTE] << 8) | b[CLOCK_SEQ_BYTE + 1];
    unsigned long long clock = (((hi << 48) | (mid << 32) | low) << 4) |
                               ((seq >> SEQ_COUNTER_SHIFT) & SEQ_COUNTER_MASK);
    unsigned int flags = seq & FLAGS_MASK;
    PyObject *producer = producer_bytes(d, b + PRODUCER_BYTE);
    if (producer == NULL)
        return NULL;
    PyObject *c = PyLong_FromUnsignedLongLong(clock);
    if (c == NULL) {
        Py_DECREF(producer);
        return NULL;
    }
    PyObject *ids = PyTuple_New(3);
    if (ids == NULL) {
        Py_DECREF(producer);
        Py_DECREF(c);
        return NULL;
    }
    PyTuple_SET_ITEM(ids, 0, producer);
    PyTuple_SET_ITEM(ids, 1, c);
    PyTuple_SET_ITEM(ids, 2, Py_NewRef(PyTuple_GET_ITEM(d->flag_values, flags)));
    /* Immutable, and nothing in it can refer back to it: never part of a cycle, so the
     * collector need not look at it. */
    PyObject_GC_UnTrack(ids);
    return ids;
}

static PyObject *
decoder_uuid_ids(DecoderObj *d, PyObject *value)
{
    return ids_of(d, value);
}

static PyObject *
decoder_decode_json_lines(DecoderObj *d, PyObject *args)
{
    Py_buffer buf;
    long long base;
    PyObject *journal, *uuid_field;
    Py_ssize_t limit;
    if (!PyArg_ParseTuple(args, "y*LUUn:decode_json_lines", &buf, &base, &journal, &uuid_field,
                          &limit))
        return NULL;
    if (limit < 0 || limit > buf.len)
        limit = buf.len;
    const char *data = buf.buf;
    PyObject *out = PyList_New(0);
    if (out == NULL) {
        PyBuffer_Release(&buf);
        return NULL;
    }
    Py_ssize_t pos = 0;
    PyObject *last_end = NULL;
    /* Each line is handed to `loads` in one reused bytearray (a new one whenever `loads`
     * kept a reference to it): one allocation per batch rather than per line. */
    PyObject *line = NULL;
    while (pos < limit) {
        const char *nl = memchr(data + pos, '\n', (size_t)(limit - pos));
        if (nl == NULL)
            break;
        Py_ssize_t stop = nl - data + 1;
        if (line != NULL && Py_REFCNT(line) != 1)
            Py_CLEAR(line);
        if (line == NULL) {
            line = PyByteArray_FromStringAndSize(data + pos, stop - pos);
            if (line == NULL)
                goto error;
        } else {
            if (PyByteArray_Resize(line, stop - pos) < 0)
                goto error;
            memcpy(PyByteArray_AS_STRING(line), data + pos, (size_t)(stop - pos));
        }
        PyObject *doc = PyObject_CallOneArg(d->loads, line);
        if (doc == NULL) {
            if (PyErr_ExceptionMatches(PyExc_ValueError)) {
                PyErr_Clear(); /* a malformed frame: the Python path reports it */
                break;
            }
            goto error;
        }
        if (!PyDict_Check(doc)) {
            Py_DECREF(doc);
            break;
        }
        PyObject *value = PyDict_GetItemWithError(doc, uuid_field);
        PyObject *ids = value == NULL && PyErr_Occurred() ? NULL : ids_of(d, value);
        if (ids == NULL) {
            Py_DECREF(doc);
            goto error;
        }
        PyObject *msg = make(d, d->msg_type, d->msg_new, d->msg_alloc);
        if (msg == NULL || SET(&d->msg_attrs, M_DOC, msg, doc) < 0 ||
            SET(&d->msg_attrs, M_UUID_FIELD, msg, uuid_field) < 0) {
            Py_XDECREF(msg);
            Py_DECREF(doc);
            Py_DECREF(ids);
            goto error;
        }
        Py_DECREF(doc);
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
        int bad = append_envelope(d, out, journal, begin, end, msg, ids) < 0;
        Py_DECREF(begin);
        Py_DECREF(end);
        Py_DECREF(msg);
        Py_DECREF(ids);
        if (bad)
            goto error;
        pos = stop;
    }
    Py_XDECREF(line);
    Py_XDECREF(last_end);
    PyBuffer_Release(&buf);
    return Py_BuildValue("(Nn)", out, pos);
error:
    Py_XDECREF(line);
    Py_XDECREF(last_end);
    PyBuffer_Release(&buf);
    Py_DECREF(out);
    return NULL;
}

/* decode_json_chunk: decode_json_lines with one `loads` call for the whole chunk.
 *
 * When every line of data[:limit] starts with `{` and no byte of it is `[`, the lines are
 * parsed together as the JSON array `[line,line,...]` (each line keeps its newline, JSON
 * whitespace). That parse is exactly the lines' own when it gives one dict per line:
 * with no `[` the top-level array is the only array, so a comma we insert that is not at
 * its level is inside an object, where the `{` after it (or the closing `]`) is a syntax
 * error; and JSON strings cannot hold the newline before it. So every inserted comma
 * separates top-level elements, each line holds at least one element (it starts with
 * `{`), and n elements over n lines means one complete value per line: the value that
 * line parses to alone (a JSON value does not depend on its context). Anything else
 * (a syntax error, another count, a non-object) is decoded line by line by
 * decode_json_lines, which stops where the Python path must report the error. */
static PyObject *
decoder_decode_json_chunk(DecoderObj *d, PyObject *args)
{
    Py_buffer buf;
    long long base;
    PyObject *journal, *uuid_field;
    Py_ssize_t limit;
    if (!PyArg_ParseTuple(args, "y*LUUn:decode_json_chunk", &buf, &base, &journal, &uuid_field,
                          &limit))
        return NULL;
    if (limit < 0 || limit > buf.len)
        limit = buf.len;
    const char *data = buf.buf;
    /* The lines: data[0:limit] up to its last newline, each starting with `{`, no `[`;
     * ends[i] is where line i ends (after its newline). */
    while (limit > 0 && data[limit - 1] != '\n')
        limit--;
    Py_ssize_t n = 0, cap = 0, *ends = NULL;
    int eligible = limit > 0 && data[0] == '{' && memchr(data, '[', (size_t)limit) == NULL;
    for (Py_ssize_t pos = 0; eligible && pos < limit; n++) {
        if (n == cap) {
            cap = cap ? 2 * cap : 256;
            Py_ssize_t *grown = PyMem_Realloc(ends, (size_t)cap * sizeof(Py_ssize_t));
            if (grown == NULL) {
                PyErr_NoMemory();
                goto error_nolist;
            }
            ends = grown;
        }
        pos = (const char *)memchr(data + pos, '\n', (size_t)(limit - pos)) - data + 1;
        ends[n] = pos;
        if (pos < limit && data[pos] != '{')
            eligible = 0;
    }
    PyObject *docs = NULL;
    if (eligible) {
        /* "[" + line + "," + line + ... + line + "]" */
        PyObject *text = PyBytes_FromStringAndSize(NULL, limit + n + 1);
        if (text == NULL)
            goto error_nolist;
        char *w = PyBytes_AS_STRING(text);
        *w++ = '[';
        for (Py_ssize_t i = 0, pos = 0; i < n; pos = ends[i++]) {
            memcpy(w, data + pos, (size_t)(ends[i] - pos));
            w += ends[i] - pos;
            *w++ = i + 1 < n ? ',' : ']';
        }
        docs = PyObject_CallOneArg(d->loads, text);
        Py_DECREF(text);
        if (docs == NULL) {
            if (!PyErr_ExceptionMatches(PyExc_ValueError))
                goto error_nolist;
            PyErr_Clear(); /* a malformed line: found and reported line by line */
        } else if (!PyList_CheckExact(docs) || PyList_GET_SIZE(docs) != n) {
            Py_CLEAR(docs);
        } else {
            for (Py_ssize_t i = 0; i < n; i++)
                if (!PyDict_Check(PyList_GET_ITEM(docs, i))) {
                    Py_CLEAR(docs); /* not an object: reported line by line */
                    break;
                }
        }
    }
    if (docs == NULL) {
        PyMem_Free(ends);
        PyBuffer_Release(&buf);
        return decoder_decode_json_lines(d, args);
    }
    PyObject *out = PyList_New(n);
    if (out == NULL)
        goto error;
    PyObject *begin = PyLong_FromLongLong(base);
    if (begin == NULL)
        goto error;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *doc = PyList_GET_ITEM(docs, i);
        PyObject *value = PyDict_GetItemWithError(doc, uuid_field);
        PyObject *ids = value == NULL && PyErr_Occurred() ? NULL : ids_of(d, value);
        PyObject *end = ids == NULL ? NULL : PyLong_FromLongLong(base + ends[i]);
        PyObject *msg = end == NULL ? NULL : make(d, d->msg_type, d->msg_new, d->msg_alloc);
        PyObject *env = msg == NULL ? NULL : make(d, d->env_type, d->env_new, d->env_alloc);
        int bad = env == NULL || SET(&d->msg_attrs, M_DOC, msg, doc) < 0 ||
                  SET(&d->msg_attrs, M_UUID_FIELD, msg, uuid_field) < 0 ||
                  SET(&d->env_attrs, E_JOURNAL, env, journal) < 0 ||
                  SET(&d->env_attrs, E_BEGIN, env, begin) < 0 ||
                  SET(&d->env_attrs, E_END, env, end) < 0 ||
                  SET(&d->env_attrs, E_MESSAGE, env, msg) < 0 ||
                  SET(&d->env_attrs, E_IDS, env, ids) < 0;
        Py_XDECREF(ids);
        Py_XDECREF(msg);
        Py_DECREF(begin);
        if (bad) {
            Py_XDECREF(env);
            Py_XDECREF(end);
            goto error;
        }
        PyList_SET_ITEM(out, i, env);
        begin = end; /* one int object for a frame's end and the next frame's begin */
    }
    Py_DECREF(begin);
    Py_DECREF(docs);
    PyMem_Free(ends);
    PyBuffer_Release(&buf);
    return Py_BuildValue("(Nn)", out, limit);
error:
    Py_XDECREF(out);
    Py_XDECREF(docs);
error_nolist:
    PyMem_Free(ends);
    PyBuffer_Release(&buf);
    return NULL;
}

/* Whether needle (m > 0 bytes) occurs in hay[0:n]. */
static int
contains(const char *hay, Py_ssize_t n, const char *needle, Py_ssize_t m)
{
    const char *end = hay + n - m;
    while (hay <= end) {
        const char *p = memchr(hay, needle[0], (size_t)(end - hay + 1));
        if (p == NULL)
            return 0;
        if (memcmp(p, needle, (size_t)m) == 0)
            return 1;
        hay = p + 1;
    }
    return 0;
}

/* Whether a backslash followed by 'u' (a \u escape, which could spell the UUID key) occurs
 * in s[0:n]. */
static int
has_u_escape(const char *s, Py_ssize_t n)
{
    const char *end = s + n;
    while (s < end) {
        const char *p = memchr(s, '\\', (size_t)(end - s));
        if (p == NULL || p + 1 >= end)
            return 0;
        if (p[1] == 'u')
            return 1;
        s = p + 2; /* the escaped character cannot start another escape */
    }
    return 0;
}

static PyObject *
decoder_decode_json_lazy(DecoderObj *d, PyObject *args)
{
    Py_buffer buf;
    long long base;
    PyObject *journal, *uuid_field;
    Py_ssize_t start, limit;
    if (!PyArg_ParseTuple(args, "y*LUUnn:decode_json_lazy", &buf, &base, &journal, &uuid_field,
                          &start, &limit))
        return NULL;
    if (d->line_type == NULL) {
        PyBuffer_Release(&buf);
        PyErr_SetString(PyExc_TypeError, "decode_json_lazy(): the Decoder has no line class");
        return NULL;
    }
    if (limit < 0 || limit > buf.len)
        limit = buf.len;
    if (start < 0)
        start = 0;
    Py_ssize_t fn;
    const char *field = PyUnicode_AsUTF8AndSize(uuid_field, &fn);
    if (field == NULL) {
        PyBuffer_Release(&buf);
        return NULL;
    }
    /* The line must start with {"<field>":" and the UUID's closing quote; the key "<field>"
     * must not occur again (nor a \u escape that could spell it): a later key of the same
     * name would override the first when the line is parsed. */
    Py_ssize_t n = fn + 5; /* {" field ":" */
    char *key = PyMem_Malloc((size_t)fn + 2);
    if (key == NULL) {
        PyBuffer_Release(&buf);
        return PyErr_NoMemory();
    }
    key[0] = '"';
    memcpy(key + 1, field, (size_t)fn);
    key[fn + 1] = '"';
    const char *data = buf.buf;
    PyObject *last_end = NULL;
    PyObject *out = PyList_New(0);
    if (out == NULL)
        goto error;
    Py_ssize_t pos = start;
    while (pos < limit) {
        const char *nl = memchr(data + pos, '\n', (size_t)(limit - pos));
        if (nl == NULL)
            break;
        Py_ssize_t stop = nl - data + 1, len = stop - pos;
        const char *l = data + pos;
        unsigned char b[16];
        /* Last member: ...,"<field>":"<uuid>"}\n. A parser keeps the last of repeated keys,
         * and the closing brace right after the value makes it a member of the top-level
         * object (the 36 characters hold no quote or backslash). */
        Py_ssize_t k = len - 41 - (fn + 2); /* where the key's quote would be */
        int last = k >= 1 && l[0] == '{' && l[len - 2] == '}' && l[len - 3] == '"' &&
                   l[len - 40] == '"' && l[len - 41] == ':' &&
                   (l[k - 1] == ',' || l[k - 1] == '{') &&
                   memcmp(l + k, key, (size_t)fn + 2) == 0 &&
                   uuid_text_bytes((const unsigned char *)l + len - 39, b);
        /* First member: {"<field>":"<uuid>"..., with no later "<field>" key (nor a \u
         * escape that could spell one), which would override it. */
        if (!last &&
            (len < n + 37 || l[0] != '{' || memcmp(l + 1, key, (size_t)fn + 2) != 0 ||
             l[fn + 3] != ':' || l[fn + 4] != '"' || l[n + 36] != '"' ||
             !uuid_text_bytes((const unsigned char *)l + n, b) ||
             contains(l + n + 37, len - n - 37, key, fn + 2) || has_u_escape(l, len)))
            break; /* left to the caller, which parses it */
        PyObject *ids = ids_of_bytes(d, b);
        if (ids == NULL)
            goto error;
        PyObject *begin = last_end != NULL ? last_end : PyLong_FromLongLong(base + pos);
        last_end = NULL;
        PyObject *end = PyLong_FromLongLong(base + stop);
        PyObject *text = PyBytes_FromStringAndSize(l, len);
        PyObject *msg = NULL;
        int bad = begin == NULL || end == NULL || text == NULL;
        if (!bad) {
            msg = make(d, d->line_type, d->line_new, d->line_alloc);
            bad = msg == NULL || SET(&d->line_attrs, L_LINE, msg, text) < 0 ||
                  SET(&d->line_attrs, L_UUID_FIELD, msg, uuid_field) < 0 ||
                  SET(&d->line_attrs, L_JOURNAL, msg, journal) < 0 ||
                  SET(&d->line_attrs, L_BEGIN, msg, begin) < 0 ||
                  append_envelope(d, out, journal, begin, end, msg, ids) < 0;
        }
        if (!bad)
            last_end = Py_NewRef(end); /* one int object for a frame's end and the next begin */
        Py_XDECREF(begin);
        Py_XDECREF(end);
        Py_XDECREF(text);
        Py_XDECREF(msg);
        Py_DECREF(ids);
        if (bad)
            goto error;
        pos = stop;
    }
    Py_XDECREF(last_end);
    PyMem_Free(key);
    PyBuffer_Release(&buf);
    return Py_BuildValue("(Nn)", out, pos);
error:
    Py_XDECREF(last_end);
    PyMem_Free(key);
    PyBuffer_Release(&buf);
    Py_XDECREF(out);
    return NULL;
}

static PyMethodDef decoder_methods[] = {
    {"decode_json_lines", (PyCFunction)decoder_decode_json_lines, METH_VARARGS,
     "decode_json_lines(data, base, journal, uuid_field, limit) -> (envelopes, consumed):\n"
     "Envelopes of JSONMessages for the complete lines of data[:limit], stopping before the\n"
     "first line that is not a JSON object; consumed is where decoding stopped."},
    {"decode_json_chunk", (PyCFunction)decoder_decode_json_chunk, METH_VARARGS,
     "decode_json_chunk(data, base, journal, uuid_field, limit) -> (envelopes, consumed):\n"
     "decode_json_lines, with the lines parsed by one `loads` call when each starts with '{'\n"
     "and none holds '[' (and line by line otherwise): the same envelopes and stop."},
    {"decode_json_lazy", (PyCFunction)decoder_decode_json_lazy, METH_VARARGS,
     "decode_json_lazy(data, base, journal, uuid_field, start, limit) -> (envelopes, stop):\n"
     "Envelopes of JSONLines (unparsed) for the complete lines of data[start:limit] whose\n"
     "UUID field is their last member, or their first with its key not repeated; stop is\n"
     "where the first other line begins (left to the caller)."},
    {"uuid_ids", (PyCFunction)decoder_uuid_ids, METH_O,
     "uuid_ids(value) -> (producer, clock, flags), or None if value is not a canonical UUID."},
    {NULL, NULL, 0, NULL},
};

static PyType_Slot decoder_slots[] = {
    {Py_tp_new, decoder_new},
    {Py_tp_dealloc, decoder_dealloc},
    {Py_tp_traverse, decoder_traverse},
    {Py_tp_clear, decoder_clear},
    {Py_tp_methods, decoder_methods},
    {Py_tp_doc, "Decoder(Envelope, JSONMessage, loads, flag_values, nil_fields): the JSON-lines"
                " decode hot path (see oncelog.framing.jsonlines)."},
    {0, NULL},
};

static PyType_Spec decoder_spec = {
    .name = "oncelog._speedups.Decoder",
    .basicsize = sizeof(DecoderObj),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_IMMUTABLETYPE,
    .slots = decoder_slots,
};

/* --------------------------------------------------------------------------------------
 * The module */

/* PyModule_AddObjectRef, stealing `value` (PyModule_Add is 3.13+). */
static int
add_object(PyObject *module, const char *name, PyObject *value)
{
    if (value == NULL)
        return -1;
    int rc = PyModule_AddObjectRef(module, name, value);
    Py_DECREF(value);
    return rc;
}

static int
add_type(PyObject *module, PyType_Spec *spec, PyTypeObject **out)
{
    *out = (PyTypeObject *)PyType_FromModuleAndSpec(module, spec, NULL);
    if (*out == NULL)
        return -1;
    return PyModule_AddType(module, *out);
}

static int
speedups_exec(PyObject *module)
{
    ModState *st = state_of(module);
    for (int i = 0; i < F_N; i++)
        if ((st->names[i] = PyUnicode_InternFromString(FIELD_NAMES[i])) == NULL)
            return -1;
    if ((st->str_ids = PyUnicode_InternFromString("ids")) == NULL)
        return -1;
    if (add_type(module, &partial_spec, &st->partial_type) < 0 ||
        add_type(module, &kernel_spec, &st->kernel_type) < 0 ||
        add_type(module, &seqiter_spec, &st->seqiter_type) < 0 ||
        add_type(module, &decoder_spec, &st->decoder_type) < 0)
        return -1;
    PyObject *layout = Py_BuildValue(
        "{sLsisisisisisisisisisi}", "UNIX_EPOCH_OFFSET", (long long)UNIX_EPOCH_OFFSET,
        "OUTSIDE_TXN", OUTSIDE_TXN, "CONTINUE_TXN", CONTINUE_TXN,
        "ACK_TXN", ACK_TXN, "FLAGS_MASK", FLAGS_MASK, "CLOCK_SEQ_BYTE", CLOCK_SEQ_BYTE,
        "SEQ_COUNTER_SHIFT", SEQ_COUNTER_SHIFT, "SEQ_COUNTER_MASK", SEQ_COUNTER_MASK,
        "TIME_HI_MASK", TIME_HI_MASK, "PRODUCER_BYTE", PRODUCER_BYTE, "PRODUCER_ID_LEN",
        PRODUCER_ID_LEN);
    if (add_object(module, "LAYOUT", layout) < 0)
        return -1;
    PyObject *outcomes = PyTuple_New(O_N);
    if (outcomes == NULL)
        return -1;
    for (int i = 0; i < O_N; i++) {
        PyObject *v = PyUnicode_FromString(OUTCOME_VALUES[i]);
        if (v == NULL) {
            Py_DECREF(outcomes);
            return -1;
        }
        PyTuple_SET_ITEM(outcomes, i, v);
    }
    if (add_object(module, "OUTCOMES", outcomes) < 0)
        return -1;
    PyObject *warnings = Py_BuildValue("(sss)", "UNEXPECTED_FLAGS", "OUTSIDE_AFTER_PENDING",
                                       "ACK_BELOW_LAST");
    return add_object(module, "WARNINGS", warnings);
}

static int
speedups_traverse(PyObject *module, visitproc visit, void *arg)
{
    ModState *st = state_of(module);
    Py_VISIT(st->partial_type);
    Py_VISIT(st->kernel_type);
    Py_VISIT(st->seqiter_type);
    Py_VISIT(st->decoder_type);
    return 0;
}

static int
speedups_clear(PyObject *module)
{
    ModState *st = state_of(module);
    Py_CLEAR(st->partial_type);
    Py_CLEAR(st->kernel_type);
    Py_CLEAR(st->seqiter_type);
    Py_CLEAR(st->decoder_type);
    for (int i = 0; i < F_N; i++)
        Py_CLEAR(st->names[i]);
    Py_CLEAR(st->str_ids);
    return 0;
}

static void
speedups_free(void *module)
{
    speedups_clear((PyObject *)module);
}

static PyModuleDef_Slot speedups_slots[] = {
    {Py_mod_exec, speedups_exec},
    {0, NULL},
};

/* --------------------------------------------------------------------------------------
 * object_lines */

#define MAX_OPENERS 1024 /* the deepest nesting orjson accepts (see oncelog.spark.batches) */

/* object_lines(chunk): the byte lengths (int64, native order, newline excluded) of the
 * lines of `chunk` if it ends with a newline and every line starts with '{', ends with '}'
 * and holds at most MAX_OPENERS of '{' and '['; None otherwise. The scan of
 * oncelog.spark.batches._object_lines in one pass (its other checks stay in Python). */
static PyObject *
speedups_object_lines(PyObject *module, PyObject *arg)
{
    if (!PyBytes_Check(arg)) {
        PyErr_Format(PyExc_TypeError, "object_lines() takes bytes, not %.100s",
                     Py_TYPE(arg)->tp_name);
        return NULL;
    }
    const char *p = PyBytes_AS_STRING(arg);
    Py_ssize_t len = PyBytes_GET_SIZE(arg);
    if (len == 0 || p[len - 1] != '\n')
        Py_RETURN_NONE;
    const char *end = p + len;
    Py_ssize_t n = 0;
    for (const char *q = p; q < end; n++) {
        const char *nl = memchr(q, '\n', (size_t)(end - q));
        q = nl + 1; /* found: the chunk ends with one */
    }
    PyObject *out = PyBytes_FromStringAndSize(NULL, n * (Py_ssize_t)sizeof(int64_t));
    if (out == NULL)
        return NULL;
    char *lens = PyBytes_AS_STRING(out);
    Py_ssize_t i = 0;
    for (const char *q = p; q < end; i++) {
        const char *nl = memchr(q, '\n', (size_t)(end - q));
        int64_t size = (int64_t)(nl - q);
        if (size == 0 || q[0] != '{' || nl[-1] != '}')
            goto none;
        if (size > MAX_OPENERS) { /* only a line this long can nest too deep */
            Py_ssize_t opens = 0;
            for (const char *c = q; c < nl; c++)
                opens += (*c == '{') | (*c == '[');
            if (opens > MAX_OPENERS)
                goto none;
        }
        memcpy(lens + i * (Py_ssize_t)sizeof(int64_t), &size, sizeof(int64_t));
        q = nl + 1;
    }
    return out;
none:
    Py_DECREF(out);
    Py_RETURN_NONE;
}

/* --------------------------------------------------------------------------------------
 * uuid_columns */

/* Which character of a lower-case version 1 UUID string goes to each position of its
 * time-sortable version 6 key (-1: a literal; see oncelog.spark.uuids._KEY_SOURCE). */
static const signed char KEY_SOURCE[36] = {
    15, 16, 17, 9, 10, 11, 12, 0, -1, 1, 2, 3, 4, -1, -1, 5, 6, 7,
    18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31, 32, 33, 34, 35,
};

static PyObject *
new_bytes(Py_ssize_t size, char **data)
{
    PyObject *b = PyBytes_FromStringAndSize(NULL, size);
    if (b != NULL)
        *data = PyBytes_AS_STRING(b);
    return b;
}

/* uuid_columns(texts, n): for n canonical UUID strings of 36 characters back to back in
 * `texts` (a buffer, any case), the buffers of oncelog.spark.uuids' columns: (lower-case
 * text, producer hex, key text, offsets of 36-character strings, offsets of 12-character
 * strings (int32), clock (int64), time (int64 microseconds), time validity bitmap (the
 * clock is not 0), flags (int32)); None if any string is not canonical. ValueError for a
 * clock of 2**63 or more. */
static PyObject *
speedups_uuid_columns(PyObject *module, PyObject *args)
{
    Py_buffer buf;
    Py_ssize_t n;
    if (!PyArg_ParseTuple(args, "y*n:uuid_columns", &buf, &n))
        return NULL;
    PyObject *result = NULL;
    PyObject *out[9] = {NULL};
    char *low, *prod, *key, *off36, *off12, *clock, *time, *valid, *flags;
    if (n < 0 || buf.len < 36 * n) {
        PyErr_SetString(PyExc_ValueError, "uuid_columns(): texts is shorter than 36 * n bytes");
        goto done;
    }
    const unsigned char *src = buf.buf;
    unsigned char raw[16];
    for (Py_ssize_t i = 0; i < n; i++)
        if (!uuid_text_bytes(src + 36 * i, raw)) {
            result = Py_NewRef(Py_None);
            goto done;
        }
    if ((out[0] = new_bytes(36 * n, &low)) == NULL ||
        (out[1] = new_bytes(2 * PRODUCER_ID_LEN * n, &prod)) == NULL ||
        (out[2] = new_bytes(36 * n, &key)) == NULL ||
        (out[3] = new_bytes(4 * (n + 1), &off36)) == NULL ||
        (out[4] = new_bytes(4 * (n + 1), &off12)) == NULL ||
        (out[5] = new_bytes(8 * n, &clock)) == NULL ||
        (out[6] = new_bytes(8 * n, &time)) == NULL ||
        (out[7] = new_bytes((n + 7) / 8, &valid)) == NULL ||
        (out[8] = new_bytes(4 * n, &flags)) == NULL)
        goto done;
    memset(valid, 0, (size_t)((n + 7) / 8));
    const int producer_char = 2 * PRODUCER_BYTE + 4;
    for (Py_ssize_t i = 0; i < n; i++) {
        const unsigned char *s = src + 36 * i;
        char *l = low + 36 * i;
        for (int j = 0; j < 36; j++) {
            unsigned char c = s[j];
            l[j] = (char)(c >= 'A' && c <= 'F' ? c + ('a' - 'A') : c);
        }
        memcpy(prod + 2 * PRODUCER_ID_LEN * i, l + producer_char, 2 * PRODUCER_ID_LEN);
        char *k = key + 36 * i;
        for (int j = 0; j < 36; j++)
            k[j] = KEY_SOURCE[j] >= 0 ? l[KEY_SOURCE[j]] : (j == 14 ? '6' : '-');
        int32_t o36 = (int32_t)(36 * i), o12 = (int32_t)(2 * PRODUCER_ID_LEN * i);
        memcpy(off36 + 4 * i, &o36, 4);
        memcpy(off12 + 4 * i, &o12, 4);
        uuid_text_bytes(s, raw);
        uint64_t ts = (uint64_t)(raw[6] & (TIME_HI_MASK >> 8)) << 56 |
                      (uint64_t)raw[7] << 48 | (uint64_t)raw[4] << 40 | (uint64_t)raw[5] << 32 |
                      (uint64_t)raw[0] << 24 | (uint64_t)raw[1] << 16 | (uint64_t)raw[2] << 8 |
                      raw[3];
        unsigned int seq = (unsigned int)raw[CLOCK_SEQ_BYTE] << 8 | raw[CLOCK_SEQ_BYTE + 1];
        uint64_t c = ts << 4 | ((seq >> SEQ_COUNTER_SHIFT) & SEQ_COUNTER_MASK);
        if (c >> 63) {
            PyErr_SetString(PyExc_ValueError, "a message UUID has a clock of 2**63 or more,"
                                              " beyond the Spark `clock` column");
            goto done;
        }
        int64_t sc = (int64_t)c, us = (int64_t)(ts / 10) - UNIX_EPOCH_OFFSET / 10;
        int32_t f = (int32_t)(seq & FLAGS_MASK);
        memcpy(clock + 8 * i, &sc, 8);
        memcpy(time + 8 * i, &us, 8);
        memcpy(flags + 4 * i, &f, 4);
        if (c != 0)
            valid[i / 8] |= (char)(1 << (i % 8));
    }
    int32_t e36 = (int32_t)(36 * n), e12 = (int32_t)(2 * PRODUCER_ID_LEN * n);
    memcpy(off36 + 4 * n, &e36, 4);
    memcpy(off12 + 4 * n, &e12, 4);
    result = PyTuple_New(9);
    if (result != NULL)
        for (int j = 0; j < 9; j++) {
            PyTuple_SET_ITEM(result, j, out[j]);
            out[j] = NULL;
        }
done:
    for (int j = 0; j < 9; j++)
        Py_XDECREF(out[j]);
    PyBuffer_Release(&buf);
    return result;
}

/* --------------------------------------------------------------------------------------
 * pack_frames */

/* pack_frames(envelopes): the committed frames of a batch packed into columns, for
 * oncelog.reading.CommittedBatch: (data, starts, begins, ends, producers, clocks, flags)
 * as bytes: `data` the frames (each envelope's `message.line`) back to back; `starts` n + 1
 * int64 positions of the frames in `data`; `begins`, `ends` the frames' journal offsets
 * (int64); `producers` 6 bytes each; `clocks` uint64; `flags` int32 (native order). A
 * frame whose `message.line` is not bytes is a TypeError (the caller packs only JSONLines).
 * Two passes: sizes first, then one copy into buffers allocated once; no object per frame
 * is made, only borrowed or looked up. */
static PyObject *
speedups_pack_frames(PyObject *module, PyObject *arg)
{
    if (!PyList_Check(arg)) {
        PyErr_Format(PyExc_TypeError, "pack_frames() takes a list, not %.100s",
                     Py_TYPE(arg)->tp_name);
        return NULL;
    }
    Py_ssize_t n = PyList_GET_SIZE(arg);
    /* Envelope attributes (0-3), the message's line (4), the parsing `ids` (5). */
    enum { P_MESSAGE, P_BEGIN, P_END, P_IDS, P_LINE, P_PARSE, P_N };
    static const char *const attr[P_N] = {"message", "begin", "end", "_ids", "line", "ids"};
    PyObject *names[P_N] = {NULL};
    AttrCache envc = {0}, msgc = {0};
    PyObject *lines = NULL, *result = NULL;
    PyObject *out[7] = {NULL};
    char *data, *starts, *begins, *ends, *prods, *clocks, *flags;
    for (int j = 0; j < P_N; j++)
        if ((names[j] = PyUnicode_InternFromString(attr[j])) == NULL)
            goto done;
    if ((lines = PyList_New(n)) == NULL)
        goto done;
    Py_ssize_t total = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *msg = cached_get(&envc, names, 4, PyList_GET_ITEM(arg, i), P_MESSAGE);
        if (msg == NULL)
            goto done;
        PyObject *line = cached_get(&msgc, names + P_LINE, 1, msg, 0);
        Py_DECREF(msg);
        if (line == NULL)
            goto done;
        if (!PyBytes_Check(line)) {
            PyErr_Format(PyExc_TypeError, "pack_frames(): a frame's line must be bytes, not %.100s",
                         Py_TYPE(line)->tp_name);
            Py_DECREF(line);
            goto done;
        }
        total += PyBytes_GET_SIZE(line);
        PyList_SET_ITEM(lines, i, line);
    }
    if ((out[0] = new_bytes(total, &data)) == NULL ||
        (out[1] = new_bytes(8 * (n + 1), &starts)) == NULL ||
        (out[2] = new_bytes(8 * n, &begins)) == NULL ||
        (out[3] = new_bytes(8 * n, &ends)) == NULL ||
        (out[4] = new_bytes(PRODUCER_ID_LEN * n, &prods)) == NULL ||
        (out[5] = new_bytes(8 * n, &clocks)) == NULL ||
        (out[6] = new_bytes(4 * n, &flags)) == NULL)
        goto done;
    int64_t pos = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *env = PyList_GET_ITEM(arg, i);
        PyObject *line = PyList_GET_ITEM(lines, i);
        Py_ssize_t size = PyBytes_GET_SIZE(line);
        memcpy(data + pos, PyBytes_AS_STRING(line), (size_t)size);
        memcpy(starts + 8 * i, &pos, 8);
        pos += size;
        long long off[2];
        for (int j = 0; j < 2; j++) {
            PyObject *v = cached_get(&envc, names, 4, env, P_BEGIN + j);
            if (v == NULL || as_offset(v, &off[j]) < 0) {
                Py_XDECREF(v);
                goto done;
            }
            Py_DECREF(v);
        }
        int64_t b64 = off[0], e64 = off[1];
        memcpy(begins + 8 * i, &b64, 8);
        memcpy(ends + 8 * i, &e64, 8);
        PyObject *ids = cached_get(&envc, names, 4, env, P_IDS);
        if (ids == Py_None) {
            Py_DECREF(ids);
            ids = PyObject_GetAttr(env, names[P_PARSE]);
        }
        if (ids == NULL)
            goto done;
        uint64_t c;
        long f;
        if (!PyTuple_Check(ids) || PyTuple_GET_SIZE(ids) != 3 ||
            !PyBytes_Check(PyTuple_GET_ITEM(ids, 0)) ||
            PyBytes_GET_SIZE(PyTuple_GET_ITEM(ids, 0)) != PRODUCER_ID_LEN) {
            Py_DECREF(ids);
            PyErr_SetString(PyExc_TypeError, "envelope ids must be (producer, clock, flags)");
            goto done;
        }
        if (as_u64(PyTuple_GET_ITEM(ids, 1), &c) < 0 ||
            ((f = PyLong_AsLong(PyTuple_GET_ITEM(ids, 2))) == -1 && PyErr_Occurred())) {
            Py_DECREF(ids);
            goto done;
        }
        memcpy(prods + PRODUCER_ID_LEN * i, PyBytes_AS_STRING(PyTuple_GET_ITEM(ids, 0)),
               PRODUCER_ID_LEN);
        Py_DECREF(ids);
        int32_t f32 = (int32_t)f;
        memcpy(clocks + 8 * i, &c, 8);
        memcpy(flags + 4 * i, &f32, 4);
    }
    memcpy(starts + 8 * n, &pos, 8);
    result = PyTuple_New(7);
    if (result != NULL)
        for (int j = 0; j < 7; j++) {
            PyTuple_SET_ITEM(result, j, out[j]);
            out[j] = NULL;
        }
done:
    for (int j = 0; j < 7; j++)
        Py_XDECREF(out[j]);
    for (int j = 0; j < P_N; j++)
        Py_XDECREF(names[j]);
    cache_clear(&envc);
    cache_clear(&msgc);
    Py_XDECREF(lines);
    return result;
}

/* --------------------------------------------------------------------------------------
 * committed_columns: read-committed over a chunk of JSON lines, with no object per line
 * (oncelog.sequencing.columnar states it in Python, and says when it applies). */

/* A producer's record in the table passed in and out (32 bytes, native order). */
typedef struct {
    unsigned char producer[8]; /* PRODUCER_ID_LEN bytes, then zeros */
    uint64_t min, max;          /* last acknowledged clock, largest pending clock */
    int64_t begin;              /* offset of the pending transaction's first frame, or -1 */
} ColProducer;

/* A pending frame carried to the next chunk (40 bytes, native order). */
typedef struct {
    int64_t begin, end, start; /* journal offsets; where its bytes start in the carry data */
    uint64_t clock;
    int32_t producer; /* index in the table */
    int32_t flags;
} ColFrame;

/* The UUID bytes of a JSON line read as decode_json_lazy reads it without parsing (the
 * same two shapes, the same checks: keep them identical); 0 if it would be parsed. */
static int
lazy_line_uuid(const char *l, Py_ssize_t len, const char *key, Py_ssize_t fn,
               unsigned char b[16])
{
    Py_ssize_t n = fn + 5;
    Py_ssize_t k = len - 41 - (fn + 2);
    if (k >= 1 && l[0] == '{' && l[len - 2] == '}' && l[len - 3] == '"' && l[len - 40] == '"' &&
        l[len - 41] == ':' && (l[k - 1] == ',' || l[k - 1] == '{') &&
        memcmp(l + k, key, (size_t)fn + 2) == 0 &&
        uuid_text_bytes((const unsigned char *)l + len - 39, b))
        return 1;
    return !(len < n + 37 || l[0] != '{' || memcmp(l + 1, key, (size_t)fn + 2) != 0 ||
             l[fn + 3] != ':' || l[fn + 4] != '"' || l[n + 36] != '"' ||
             !uuid_text_bytes((const unsigned char *)l + n, b) ||
             contains(l + n + 37, len - n - 37, key, fn + 2) || has_u_escape(l, len));
}

/* clock and flags of UUID bytes, as ids_of_bytes computes them. */
static void
uuid_clock_flags(const unsigned char b[16], uint64_t *clock, int32_t *flags)
{
    unsigned long long hi = ((unsigned long long)(((b[6] << 8) | b[7]) & TIME_HI_MASK));
    unsigned long long mid = ((unsigned long long)b[4] << 8) | b[5];
    unsigned long long low = ((unsigned long long)b[0] << 24) | ((unsigned long long)b[1] << 16) |
                             ((unsigned long long)b[2] << 8) | b[3];
    unsigned int seq = ((unsigned int)b[CLOCK_SEQ_BYTE] << 8) | b[CLOCK_SEQ_BYTE + 1];
    *clock = (((hi << 48) | (mid << 32) | low) << 4) |
             ((seq >> SEQ_COUNTER_SHIFT) & SEQ_COUNTER_MASK);
    *flags = (int32_t)(seq & FLAGS_MASK);
}

static inline uint64_t
producer_key(const unsigned char *p)
{
    uint64_t v = 0;
    for (int i = 0; i < PRODUCER_ID_LEN; i++)
        v = (v << 8) | p[i];
    return v;
}

/* committed_columns(data, base, uuid_field, table, carry_data, carry_frames, acks, max_carry):
 * see oncelog.sequencing.columnar.committed_columns, which this is, result for result. */
static PyObject *
speedups_committed_columns(PyObject *module, PyObject *args)
{
    Py_buffer buf, tab, cdata, cfr;
    long long base;
    PyObject *uuid_field;
    int acks;
    Py_ssize_t max_carry;
    if (!PyArg_ParseTuple(args, "y*LUy*y*y*pn:committed_columns", &buf, &base, &uuid_field,
                          &tab, &cdata, &cfr, &acks, &max_carry))
        return NULL;
    PyObject *result = NULL;
    PyObject *out[10] = {NULL};
    char *key = NULL;
    int32_t *nxt = NULL, *head = NULL, *tail = NULL, *emit = NULL, *slots = NULL;
    unsigned char *pend = NULL;
    ColProducer *prods = NULL;
    ColFrame *frames = NULL; /* the carried frames, then the chunk's lines */
    if (tab.len % (Py_ssize_t)sizeof(ColProducer) || cfr.len % (Py_ssize_t)sizeof(ColFrame)) {
        PyErr_SetString(PyExc_ValueError, "committed_columns(): malformed table or carry");
        goto done;
    }
    Py_ssize_t fn;
    const char *field = PyUnicode_AsUTF8AndSize(uuid_field, &fn);
    if (field == NULL)
        goto done;
    const char *data = buf.buf;
    Py_ssize_t len = buf.len;
    if (len == 0 || data[len - 1] != '\n')
        goto none;
    Py_ssize_t nlines = 0;
    for (const char *q = data; q < data + len; nlines++)
        q = (const char *)memchr(q, '\n', (size_t)(data + len - q)) + 1;
    Py_ssize_t ntab = tab.len / (Py_ssize_t)sizeof(ColProducer);
    Py_ssize_t m = cfr.len / (Py_ssize_t)sizeof(ColFrame), total = m + nlines;
    Py_ssize_t cap = ntab + nlines, nslots = 16;
    while (nslots < 2 * cap)
        nslots <<= 1;
    key = PyMem_Malloc((size_t)fn + 2);
    prods = PyMem_Malloc((size_t)cap * sizeof(ColProducer));
    frames = PyMem_Malloc((size_t)total * sizeof(ColFrame) + 1);
    nxt = PyMem_Malloc((size_t)total * sizeof(int32_t) + 1);
    emit = PyMem_Malloc((size_t)total * sizeof(int32_t) + 1);
    pend = PyMem_Calloc((size_t)total + 1, 1);
    head = PyMem_Malloc((size_t)cap * sizeof(int32_t) + 1);
    tail = PyMem_Malloc((size_t)cap * sizeof(int32_t) + 1);
    slots = PyMem_Malloc((size_t)nslots * sizeof(int32_t));
    if (!key || !prods || !frames || !nxt || !emit || !pend || !head || !tail || !slots) {
        PyErr_NoMemory();
        goto done;
    }
    key[0] = '"';
    memcpy(key + 1, field, (size_t)fn);
    key[fn + 1] = '"';
    memcpy(prods, tab.buf, (size_t)tab.len);
    memcpy(frames, cfr.buf, (size_t)cfr.len);
    memset(slots, 0xff, (size_t)nslots * sizeof(int32_t));
    for (Py_ssize_t i = 0; i < cap; i++)
        head[i] = tail[i] = -1;
    Py_ssize_t nprod = ntab;
    for (Py_ssize_t i = 0; i < ntab; i++) {
        size_t s = (size_t)(producer_key(prods[i].producer) * 0x9E3779B97F4A7C15ull >> 20);
        while (slots[s & (nslots - 1)] != -1)
            s++;
        slots[s & (nslots - 1)] = (int32_t)i;
    }
    /* The carried frames are pending, in journal order, each in its producer's list. */
    for (Py_ssize_t j = 0; j < m; j++) {
        int32_t p = frames[j].producer;
        if (p < 0 || p >= ntab || frames[j].start < 0 ||
            frames[j].start + (frames[j].end - frames[j].begin) > cdata.len) {
            PyErr_SetString(PyExc_ValueError, "committed_columns(): malformed carry");
            goto done;
        }
        nxt[j] = -1;
        pend[j] = 1;
        if (tail[p] == -1)
            head[p] = (int32_t)j;
        else
            nxt[tail[p]] = (int32_t)j;
        tail[p] = (int32_t)j;
    }
    Py_ssize_t nemit = 0, pos = 0;
    for (Py_ssize_t g = m; g < total; g++) {
        const char *l = data + pos;
        Py_ssize_t stop = (const char *)memchr(l, '\n', (size_t)(len - pos)) - data + 1;
        unsigned char b[16];
        if (!lazy_line_uuid(l, stop - pos, key, fn, b))
            goto none; /* parsed by lazy reading */
        ColFrame *fr = &frames[g];
        fr->begin = base + pos;
        fr->end = base + stop;
        fr->start = pos;
        uuid_clock_flags(b, &fr->clock, &fr->flags);
        pos = stop;
        uint64_t c = fr->clock;
        if (c < 2 || fr->flags > 2)
            goto none; /* nil or zero clocks, unexpected flags: the kernel's own cases */
        uint64_t v = producer_key(b + PRODUCER_BYTE);
        size_t s = (size_t)(v * 0x9E3779B97F4A7C15ull >> 20);
        int32_t p;
        for (;; s++) {
            p = slots[s & (nslots - 1)];
            if (p == -1 || producer_key(prods[p].producer) == v)
                break;
        }
        if (p == -1) { /* new to the journal: as the kernel's decide() makes it */
            p = (int32_t)nprod++;
            slots[s & (nslots - 1)] = p;
            memset(prods[p].producer, 0, 8);
            memcpy(prods[p].producer, b + PRODUCER_BYTE, PRODUCER_ID_LEN);
            prods[p].min = prods[p].max = c - 1;
            prods[p].begin = -1;
        }
        fr->producer = p;
        nxt[g] = -1;
        ColProducer *pr = &prods[p];
        if (fr->flags == 1) { /* CONTINUE_TXN */
            if (c <= pr->max)
                continue; /* already acknowledged, or the open transaction holds it */
            if (pr->begin == -1)
                pr->begin = fr->begin;
            pend[g] = 1;
            if (tail[p] == -1)
                head[p] = (int32_t)g;
            else
                nxt[tail[p]] = (int32_t)g;
            tail[p] = (int32_t)g;
            pr->max = c;
        }
        else if (fr->flags == 2) { /* ACK_TXN */
            if (c < pr->min)
                goto none; /* the kernel warns and falls back to at-least-once */
            int delivered_c = 0;
            for (int32_t h = head[p]; h != -1; h = nxt[h]) {
                pend[h] = 0;
                if (c > pr->min && frames[h].clock <= c) {
                    emit[nemit++] = h;
                    delivered_c = frames[h].clock == c;
                }
            }
            if (c > pr->min && acks && !delivered_c)
                emit[nemit++] = (int32_t)g;
            head[p] = tail[p] = -1;
            pr->min = pr->max = c;
            pr->begin = -1;
        }
        else { /* OUTSIDE_TXN */
            if (c <= pr->min)
                continue;
            if (pr->begin != -1)
                goto none; /* the kernel warns, and rolls back the open transaction */
            emit[nemit++] = (int32_t)g;
            pr->min = pr->max = c;
        }
    }
    /* The frames still pending are carried over, in journal order. */
    Py_ssize_t ncarry = 0, carry_bytes = 0, out_bytes = 0;
    for (Py_ssize_t g = 0; g < total; g++)
        if (pend[g]) {
            ncarry++;
            carry_bytes += frames[g].end - frames[g].begin;
        }
    if (carry_bytes > max_carry)
        goto none;
    for (Py_ssize_t i = 0; i < nemit; i++)
        out_bytes += frames[emit[i]].end - frames[emit[i]].begin;
    char *od, *ost, *obe, *oen, *opr, *ocl, *ofl, *otab, *ocd, *ocf;
    if ((out[0] = new_bytes(out_bytes, &od)) == NULL ||
        (out[1] = new_bytes((nemit + 1) * 8, &ost)) == NULL ||
        (out[2] = new_bytes(nemit * 8, &obe)) == NULL ||
        (out[3] = new_bytes(nemit * 8, &oen)) == NULL ||
        (out[4] = new_bytes(nemit * PRODUCER_ID_LEN, &opr)) == NULL ||
        (out[5] = new_bytes(nemit * 8, &ocl)) == NULL ||
        (out[6] = new_bytes(nemit * 4, &ofl)) == NULL ||
        (out[7] = new_bytes(nprod * (Py_ssize_t)sizeof(ColProducer), &otab)) == NULL ||
        (out[8] = new_bytes(carry_bytes, &ocd)) == NULL ||
        (out[9] = new_bytes(ncarry * (Py_ssize_t)sizeof(ColFrame), &ocf)) == NULL)
        goto done;
    int64_t at = 0;
    const char *carried = cdata.buf;
    for (Py_ssize_t i = 0; i < nemit; i++) {
        ColFrame *fr = &frames[emit[i]];
        int64_t size = fr->end - fr->begin;
        memcpy(od + at, (emit[i] < m ? carried : data) + fr->start, (size_t)size);
        memcpy(ost + 8 * i, &at, 8);
        at += size;
        memcpy(obe + 8 * i, &fr->begin, 8);
        memcpy(oen + 8 * i, &fr->end, 8);
        memcpy(opr + PRODUCER_ID_LEN * i, prods[fr->producer].producer, PRODUCER_ID_LEN);
        memcpy(ocl + 8 * i, &fr->clock, 8);
        memcpy(ofl + 4 * i, &fr->flags, 4);
    }
    memcpy(ost + 8 * nemit, &at, 8);
    memcpy(otab, prods, (size_t)nprod * sizeof(ColProducer));
    at = 0;
    Py_ssize_t k = 0;
    for (Py_ssize_t g = 0; g < total; g++) {
        if (!pend[g])
            continue;
        ColFrame c = frames[g];
        int64_t size = c.end - c.begin;
        memcpy(ocd + at, (g < m ? carried : data) + c.start, (size_t)size);
        c.start = at;
        at += size;
        memcpy(ocf + k++ * (Py_ssize_t)sizeof(ColFrame), &c, sizeof(ColFrame));
    }
    result = PyTuple_New(10);
    if (result != NULL)
        for (int i = 0; i < 10; i++) {
            PyTuple_SET_ITEM(result, i, out[i]);
            out[i] = NULL;
        }
    goto done;
none:
    result = Py_NewRef(Py_None);
done:
    for (int i = 0; i < 10; i++)
        Py_XDECREF(out[i]);
    PyMem_Free(key);
    PyMem_Free(nxt);
    PyMem_Free(head);
    PyMem_Free(tail);
    PyMem_Free(emit);
    PyMem_Free(slots);
    PyMem_Free(pend);
    PyMem_Free(prods);
    PyMem_Free(frames);
    PyBuffer_Release(&buf);
    PyBuffer_Release(&tab);
    PyBuffer_Release(&cdata);
    PyBuffer_Release(&cfr);
    return result;
}

static PyMethodDef speedups_methods[] = {
    {"uuid_columns", speedups_uuid_columns, METH_VARARGS,
     "uuid_columns(texts, n) -> tuple | None: the buffers of the UUID columns of n canonical\n"
     "UUID strings back to back (see oncelog.spark.uuids), or None if one is not canonical."},
    {"object_lines", speedups_object_lines, METH_O,
     "object_lines(chunk) -> bytes | None: the int64 lengths of chunk's lines if each is\n"
     "'{' ... '}' nesting at most 1024 deep by count of '{' and '[', else None."},
    {"pack_frames", speedups_pack_frames, METH_O,
     "pack_frames(envelopes) -> tuple: (data, starts, begins, ends, producers, clocks, flags)\n"
     "buffers of the envelopes' frames (message.line) and columns (see oncelog.reading)."},
    {"committed_columns", speedups_committed_columns, METH_VARARGS,
     "committed_columns(data, base, uuid_field, table, carry_data, carry_frames, acks,\n"
     "max_carry) -> tuple | None: the committed frames of a chunk of whole JSON lines as\n"
     "columns, with the producer table and carried frames after it; None: not the simple\n"
     "case (see oncelog.sequencing.columnar)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef speedups_module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "oncelog._speedups",
    .m_doc = "C fast paths of JSON-lines decoding and sequencing (see oncelog._native).",
    .m_size = sizeof(ModState),
    .m_methods = speedups_methods,
    .m_slots = speedups_slots,
    .m_traverse = speedups_traverse,
    .m_clear = speedups_clear,
    .m_free = speedups_free,
};

PyMODINIT_FUNC
PyInit__speedups(void)
{
    return PyModuleDef_Init(&speedups_module);
}
