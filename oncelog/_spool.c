/* oncelog._spool: the hot path of a journal's appender in C (optional; the pure twin and
 * the choice between them are oncelog/journal/_spoolcore.py).
 *
 * Three base types hold the fields every append touches, as C members, and do the
 * per-append work in one C call each; oncelog.journal.appender's classes derive from them
 * and keep everything else (sealing, the writer thread, failures) in Python:
 *
 * - BatchCore (base of `_Batch`): `buf`, the batch's bytes (always a bytearray), `used`
 *   (an append was released into it) and `created` (time.monotonic() of its first one).
 * - AppendCore (base of `AsyncAppend`): `_appender`, `_batch`, `_begin`, `_end` (the
 *   append's state: _OPEN until released), and `write` / `release`.
 * - AppenderCore (base of `Appender`): `_write_lock`, `_open` (the open batch), `_room`,
 *   `_seal_requested`, `_closed`, `_append_type` (the AsyncAppend class to make), and
 *   `start_append` / `append_made`.
 *
 * They do exactly what the pure twin does, step for step (the tests run the appender's
 * suites on both): the write lock is the Python `threading.Lock` the rest of the appender
 * takes, acquired and released through its own methods; the slow paths (`_next_batch`,
 * `_hand_over`, `_wake`) and the misuse errors (`_misuse`) are the Python subclass's
 * methods, called by name. Locking is unchanged: `_room` and `_seal_requested` are written
 * under the appender's `_state` lock and read here without it (a stale value only sends an
 * append down the slow path, which re-reads them under the lock), as in Python.
 */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>

#define APPEND_OPEN (-1)

typedef struct {
    PyTypeObject *batch_type, *appender_type, *append_type, *outstanding_type, *lane_type;
    PyObject *monotonic;   /* time.monotonic */
    PyObject *s_next_batch, *s_hand_over, *s_wake, *s_misuse, *s_stale;
    PyObject *released_twice, *write_released;  /* what `_misuse` is told */
} spool_state;

/* -- BatchCore ---------------------------------------------------------------------------- */

typedef struct {
    PyObject_HEAD
    PyObject *buf;     /* a bytearray, never NULL */
    char used;
    double created;
} BatchCore;

static PyObject *
batch_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    BatchCore *self = (BatchCore *)type->tp_alloc(type, 0);
    if (self == NULL)
        return NULL;
    self->buf = PyByteArray_FromStringAndSize(NULL, 0);
    if (self->buf == NULL) {
        Py_DECREF(self);
        return NULL;
    }
    return (PyObject *)self;
}

static void
batch_dealloc(BatchCore *self)
{
    PyTypeObject *tp = Py_TYPE(self);
    Py_CLEAR(self->buf);
    tp->tp_free((PyObject *)self);
    Py_DECREF(tp);
}

static PyObject *
batch_get_buf(BatchCore *self, void *closure)
{
    return Py_NewRef(self->buf);
}

static int
batch_set_buf(BatchCore *self, PyObject *value, void *closure)
{
    if (value == NULL || !PyByteArray_CheckExact(value)) {
        PyErr_SetString(PyExc_TypeError, "a batch's buf must be a bytearray");
        return -1;
    }
    Py_SETREF(self->buf, Py_NewRef(value));
    return 0;
}

static PyGetSetDef batch_getset[] = {
    {"buf", (getter)batch_get_buf, (setter)batch_set_buf, "the batch's bytes", NULL},
    {NULL},
};

static PyMemberDef batch_members[] = {
    {"used", T_BOOL, offsetof(BatchCore, used), 0, "an append was released into it"},
    {"created", T_DOUBLE, offsetof(BatchCore, created), 0, "monotonic time of its first"},
    {NULL},
};

static PyType_Slot batch_slots[] = {
    {Py_tp_doc, "The bytes of the appends that will share one fragment (C state)."},
    {Py_tp_new, batch_new},
    {Py_tp_dealloc, batch_dealloc},
    {Py_tp_getset, batch_getset},
    {Py_tp_members, batch_members},
    {0, NULL},
};

static PyType_Spec batch_spec = {
    .name = "oncelog._spool.BatchCore",
    .basicsize = sizeof(BatchCore),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_IMMUTABLETYPE,
    .slots = batch_slots,
};

/* -- AppenderCore and AppendCore ----------------------------------------------------------- */

typedef struct {
    PyObject_HEAD
    PyObject *index;        /* the journal's claims index (its `stale` is read); NULL until set */
    PyObject *write_lock;   /* threading.Lock; NULL until set */
    PyObject *acquire;      /* write_lock.acquire, write_lock.release (bound) */
    PyObject *release;
    BatchCore *open;        /* NULL until set */
    PyObject *append_type;  /* a subtype of AppendCore; NULL until set */
    Py_ssize_t room;
    char seal_requested;
    char closed;
    PyObject *batch_type;   /* BatchCore, to check `_open` */
    PyObject *state;        /* the module (for its state) */
} AppenderCore;

typedef struct {
    PyObject_HEAD
    AppenderCore *appender;
    BatchCore *batch;
    Py_ssize_t begin;
    Py_ssize_t end;
} AppendCore;

static inline spool_state *
state_of(AppenderCore *a)
{
    return (spool_state *)PyModule_GetState(a->state);
}

static int
lock_release(AppenderCore *a)
{
    PyObject *r = PyObject_CallNoArgs(a->release);
    if (r == NULL)
        return -1;
    Py_DECREF(r);
    return 0;
}

static int append_release(AppendCore *self);

/* Let the write lock go after an error, without losing it: release `aa` (empty) if given,
 * else the appender's lock; an error of the release itself is raised with the first one
 * as its context, as a Python `finally` would. */
static void
release_keeping_error(AppenderCore *appender, AppendCore *aa)
{
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    PyErr_NormalizeException(&type, &value, &tb);
    if (tb != NULL && value != NULL)
        PyException_SetTraceback(value, tb);
    int failed = aa != NULL ? append_release(aa) : lock_release(appender);
    if (failed < 0) {
        PyObject *t2, *v2, *tb2;
        PyErr_Fetch(&t2, &v2, &tb2);
        PyErr_NormalizeException(&t2, &v2, &tb2);
        if (v2 != NULL && value != NULL)
            PyException_SetContext(v2, value);  /* steals value */
        else
            Py_XDECREF(value);
        Py_XDECREF(type);
        Py_XDECREF(tb);
        PyErr_Restore(t2, v2, tb2);
        return;
    }
    PyErr_Restore(type, value, tb);
}

static int
call_method0(PyObject *obj, PyObject *name)
{
    PyObject *r = PyObject_CallMethodNoArgs(obj, name);
    if (r == NULL)
        return -1;
    Py_DECREF(r);
    return 0;
}

static int
misuse(PyObject *self, PyObject *what)
{
    spool_state *st = state_of(((AppendCore *)self)->appender);
    PyObject *r = PyObject_CallMethodOneArg(self, st->s_misuse, what);
    if (r == NULL)
        return -1;
    Py_DECREF(r);
    PyErr_SetString(PyExc_SystemError, "_misuse returned instead of raising");
    return -1;
}

/* AppenderCore.start_append(): take the write lock and make the append (its `_begin` the
 * open batch's size); the slow path is the subclass's `_next_batch(batch)`, entered and left
 * holding the lock, which it lets go when it raises. */
static AppendCore *
appender_start(AppenderCore *self)
{
    if (self->write_lock == NULL || self->open == NULL || self->append_type == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "the appender's core is not initialised");
        return NULL;
    }
    PyObject *got = PyObject_CallNoArgs(self->acquire);
    if (got == NULL)
        return NULL;
    Py_DECREF(got);
    BatchCore *batch = self->open;
    Py_INCREF(batch);
    Py_ssize_t size = PyByteArray_GET_SIZE(batch->buf);
    if (size >= self->room) {
        PyObject *next = PyObject_CallMethodOneArg(
            (PyObject *)self, state_of(self)->s_next_batch, (PyObject *)batch);
        Py_DECREF(batch);
        if (next == NULL)
            return NULL;  /* _next_batch let the lock go */
        if (!PyObject_TypeCheck(next, (PyTypeObject *)self->batch_type)) {
            Py_DECREF(next);
            PyErr_SetString(PyExc_TypeError, "_next_batch must return a batch");
            goto unlock;
        }
        batch = (BatchCore *)next;
        size = PyByteArray_GET_SIZE(batch->buf);
    }
    PyTypeObject *tp = (PyTypeObject *)self->append_type;
    AppendCore *aa = (AppendCore *)tp->tp_alloc(tp, 0);
    if (aa == NULL) {
        Py_DECREF(batch);
        goto unlock;
    }
    aa->appender = (AppenderCore *)Py_NewRef(self);
    aa->batch = batch;  /* takes the reference */
    aa->begin = size;
    aa->end = APPEND_OPEN;
    return aa;
unlock:
    release_keeping_error(self, NULL);
    return NULL;
}

/* AppendCore.release(): queue the append for its batch and let the write lock go; a
 * requested seal hands the batch over instead (`_hand_over`), and a batch's first append
 * stamps its `created` and wakes the writer (`_wake`). */
static int
append_release(AppendCore *self)
{
    AppenderCore *appender = self->appender;
    spool_state *st = state_of(appender);
    if (self->end != APPEND_OPEN)
        return misuse((PyObject *)self, st->released_twice);
    BatchCore *batch = self->batch;
    self->end = PyByteArray_GET_SIZE(batch->buf);
    if (batch->used) {
        if (appender->seal_requested)
            return call_method0((PyObject *)appender, st->s_hand_over);
        return lock_release(appender);
    }
    batch->used = 1;  /* the batch's first append: its flush_interval starts now */
    PyObject *now = PyObject_CallNoArgs(st->monotonic);
    if (now != NULL) {
        batch->created = PyFloat_AsDouble(now);
        Py_DECREF(now);
    }
    if (now == NULL || PyErr_Occurred()) {
        /* never keep the lock: the time is lost, the batch is due at once */
        batch->created = 0.0;
        release_keeping_error(appender, NULL);
        return -1;
    }
    if (appender->seal_requested)
        return call_method0((PyObject *)appender, st->s_hand_over);
    if (lock_release(appender) < 0)
        return -1;
    return call_method0((PyObject *)appender, st->s_wake);
}

static PyObject *
appender_start_append(AppenderCore *self, PyObject *Py_UNUSED(ignored))
{
    return (PyObject *)appender_start(self);
}

/* Add `data` to the end of a batch's bytes (a bytearray): bytes are copied directly. */
static int
buf_extend(PyObject *buf, PyObject *data)
{
    if (PyBytes_CheckExact(data)) {
        Py_ssize_t at = PyByteArray_GET_SIZE(buf), n = PyBytes_GET_SIZE(data);
        if (PyByteArray_Resize(buf, at + n) < 0)
            return -1;
        memcpy(PyByteArray_AS_STRING(buf) + at, PyBytes_AS_STRING(data), (size_t)n);
        return 0;
    }
    PyObject *grown = PySequence_InPlaceConcat(buf, data);
    if (grown == NULL)
        return -1;
    Py_DECREF(grown);
    return 0;
}

/* append_made's work: start_append, write make(*args)[0], release; returns (the append,
 * make(*args)[1]). If make or the copy fails the append is released empty (nothing is
 * appended, the lock is let go) and the error propagates. */
static PyObject *
append_made(AppenderCore *self, PyObject *make, PyObject *const *args, Py_ssize_t nargs)
{
    AppendCore *aa = appender_start(self);
    if (aa == NULL)
        return NULL;
    PyObject *made = PyObject_Vectorcall(make, args, nargs, NULL);
    int ok = 0;
    if (made != NULL) {
        if (!PyTuple_CheckExact(made) || PyTuple_GET_SIZE(made) != 2)
            PyErr_SetString(PyExc_TypeError, "append_made: make must return (data, token)");
        else
            ok = buf_extend(aa->batch->buf, PyTuple_GET_ITEM(made, 0)) == 0;
    }
    if (!ok) {
        Py_XDECREF(made);
        release_keeping_error(NULL, aa);  /* released empty, as a `finally: release()` */
        Py_DECREF(aa);
        return NULL;
    }
    if (append_release(aa) < 0) {
        Py_DECREF(made);
        Py_DECREF(aa);
        return NULL;
    }
    PyObject *token = PyTuple_GET_ITEM(made, 1);
    if (Py_REFCNT(made) == 1) {
        /* ours alone (make's fresh result): it becomes the result, (append, token) */
        PyObject *data = PyTuple_GET_ITEM(made, 0);
        PyTuple_SET_ITEM(made, 0, (PyObject *)aa);
        Py_DECREF(data);
        return made;
    }
    PyObject *pair = PyTuple_Pack(2, (PyObject *)aa, token);
    Py_DECREF(made);
    Py_DECREF(aa);
    return pair;
}

/* AppenderCore.append_made(make, *args) */
static PyObject *
appender_append_made(AppenderCore *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs < 1) {
        PyErr_SetString(PyExc_TypeError, "append_made(make, *args) needs make");
        return NULL;
    }
    return append_made(self, args[0], args + 1, nargs - 1);
}

/* Whether the appender is still the one its client hands out: not closed, and its index
 * not stale (1, 0, or -1 with an error). */
static int
appender_reusable(AppenderCore *self)
{
    if (self->closed)
        return 0;
    if (self->index == NULL)
        return 1;
    PyObject *stale = PyObject_GetAttr(self->index, state_of(self)->s_stale);
    if (stale == NULL)
        return -1;
    int is_stale = PyObject_IsTrue(stale);
    Py_DECREF(stale);
    return is_stale < 0 ? -1 : !is_stale;
}

static PyObject *
appender_get_reusable(AppenderCore *self, void *closure)
{
    int reusable = appender_reusable(self);
    if (reusable < 0)
        return NULL;
    return PyBool_FromLong(reusable);
}

static PyObject *
appender_get_lock(AppenderCore *self, void *closure)
{
    if (self->write_lock == NULL)
        Py_RETURN_NONE;
    return Py_NewRef(self->write_lock);
}

static int
appender_set_lock(AppenderCore *self, PyObject *value, void *closure)
{
    if (value == NULL) {
        PyErr_SetString(PyExc_AttributeError, "the write lock cannot be deleted");
        return -1;
    }
    PyObject *acquire = PyObject_GetAttrString(value, "acquire");
    if (acquire == NULL)
        return -1;
    PyObject *release = PyObject_GetAttrString(value, "release");
    if (release == NULL) {
        Py_DECREF(acquire);
        return -1;
    }
    Py_XSETREF(self->acquire, acquire);
    Py_XSETREF(self->release, release);
    Py_XSETREF(self->write_lock, Py_NewRef(value));
    return 0;
}

static PyObject *
appender_get_open(AppenderCore *self, void *closure)
{
    if (self->open == NULL)
        Py_RETURN_NONE;
    return Py_NewRef(self->open);
}

static int
appender_set_open(AppenderCore *self, PyObject *value, void *closure)
{
    if (value == NULL || !PyObject_TypeCheck(value, (PyTypeObject *)self->batch_type)) {
        PyErr_SetString(PyExc_TypeError, "the open batch must be a BatchCore");
        return -1;
    }
    Py_XSETREF(self->open, (BatchCore *)Py_NewRef(value));
    return 0;
}

static PyObject *
appender_get_type(AppenderCore *self, void *closure)
{
    if (self->append_type == NULL)
        Py_RETURN_NONE;
    return Py_NewRef(self->append_type);
}

static int appender_set_type(AppenderCore *self, PyObject *value, void *closure);

static PyGetSetDef appender_getset[] = {
    {"reusable", (getter)appender_get_reusable, NULL,
     "Whether JournalClient.start_append would still hand out this appender: not closed, "
     "and its journal's index not stale (read without the lock).", NULL},
    {"_write_lock", (getter)appender_get_lock, (setter)appender_set_lock,
     "held by an append from start to release", NULL},
    {"_open", (getter)appender_get_open, (setter)appender_set_open, "the open batch", NULL},
    {"_append_type", (getter)appender_get_type, (setter)appender_set_type,
     "the class of the appends made (a subclass of AppendCore)", NULL},
    {NULL},
};

static PyMemberDef appender_members[] = {
    {"index", T_OBJECT, offsetof(AppenderCore, index), 0, "the journal's claims index"},
    {"_room", T_PYSSIZET, offsetof(AppenderCore, room), 0,
     "how far the open batch may grow before start_append takes the slow path"},
    {"_seal_requested", T_BOOL, offsetof(AppenderCore, seal_requested), 0,
     "the next release hands the open batch over to the writer"},
    {"_closed", T_BOOL, offsetof(AppenderCore, closed), 0, "closed: no more appends"},
    {NULL},
};

static PyMethodDef appender_methods[] = {
    {"start_append", (PyCFunction)appender_start_append, METH_NOARGS,
     "Take the write lock and begin an append."},
    {"append_made", (PyCFunction)(void (*)(void))appender_append_made, METH_FASTCALL,
     "append_made(make, *args): start_append, write make(*args)[0], release; returns "
     "(the append, make(*args)[1])."},
    {NULL},
};

static struct PyModuleDef spool_module;

static PyObject *
appender_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    PyObject *module = PyType_GetModuleByDef(type, &spool_module);
    if (module == NULL)
        return NULL;
    AppenderCore *self = (AppenderCore *)type->tp_alloc(type, 0);
    if (self == NULL)
        return NULL;
    spool_state *st = (spool_state *)PyModule_GetState(module);
    self->state = Py_NewRef(module);
    self->batch_type = Py_NewRef((PyObject *)st->batch_type);
    return (PyObject *)self;
}

static int
appender_set_type(AppenderCore *self, PyObject *value, void *closure)
{
    spool_state *st = state_of(self);
    if (value == NULL || !PyType_Check(value) ||
        !PyType_IsSubtype((PyTypeObject *)value, st->append_type)) {
        PyErr_SetString(PyExc_TypeError, "the append type must be a subclass of AppendCore");
        return -1;
    }
    Py_XSETREF(self->append_type, Py_NewRef(value));
    return 0;
}

static int
appender_traverse(AppenderCore *self, visitproc visit, void *arg)
{
    Py_VISIT(Py_TYPE(self));
    Py_VISIT(self->index);
    Py_VISIT(self->write_lock);
    Py_VISIT(self->acquire);
    Py_VISIT(self->release);
    Py_VISIT(self->open);
    Py_VISIT(self->append_type);
    Py_VISIT(self->batch_type);
    Py_VISIT(self->state);
    return 0;
}

static int
appender_clear(AppenderCore *self)
{
    Py_CLEAR(self->index);
    Py_CLEAR(self->write_lock);
    Py_CLEAR(self->acquire);
    Py_CLEAR(self->release);
    Py_CLEAR(self->open);
    Py_CLEAR(self->append_type);
    Py_CLEAR(self->batch_type);
    Py_CLEAR(self->state);
    return 0;
}

static void
appender_dealloc(AppenderCore *self)
{
    PyTypeObject *tp = Py_TYPE(self);
    PyObject_GC_UnTrack(self);
    appender_clear(self);
    tp->tp_free((PyObject *)self);
    Py_DECREF(tp);
}

static PyType_Slot appender_slots[] = {
    {Py_tp_doc, "The state an append touches, and start_append / append_made in C."},
    {Py_tp_new, appender_new},
    {Py_tp_dealloc, appender_dealloc},
    {Py_tp_traverse, appender_traverse},
    {Py_tp_clear, appender_clear},
    {Py_tp_getset, appender_getset},
    {Py_tp_members, appender_members},
    {Py_tp_methods, appender_methods},
    {0, NULL},
};

static PyType_Spec appender_spec = {
    .name = "oncelog._spool.AppenderCore",
    .basicsize = sizeof(AppenderCore),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC |
             Py_TPFLAGS_IMMUTABLETYPE,
    .slots = appender_slots,
};

/* -- AppendCore ------------------------------------------------------------------------ */

static PyObject *
append_write(AppendCore *self, PyObject *data)
{
    if (self->end != APPEND_OPEN) {
        misuse((PyObject *)self, state_of(self->appender)->write_released);
        return NULL;
    }
    PyObject *grown = PySequence_InPlaceConcat(self->batch->buf, data);
    if (grown == NULL)
        return NULL;
    Py_DECREF(grown);
    Py_ssize_t n = PyObject_Length(data);  /* len(data), as the pure path returns */
    return n < 0 ? NULL : PyLong_FromSsize_t(n);
}

static PyObject *
append_release_meth(AppendCore *self, PyObject *Py_UNUSED(ignored))
{
    if (append_release(self) < 0)
        return NULL;
    Py_RETURN_NONE;
}

static PyObject *
append_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    PyObject *appender, *batch;
    Py_ssize_t begin;
    static char *kwlist[] = {"appender", "batch", "begin", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OOn", kwlist, &appender, &batch, &begin))
        return NULL;
    PyObject *module = PyType_GetModuleByDef(type, &spool_module);
    if (module == NULL)
        return NULL;
    spool_state *st = (spool_state *)PyModule_GetState(module);
    if (!PyObject_TypeCheck(appender, st->appender_type) ||
        !PyObject_TypeCheck(batch, st->batch_type)) {
        PyErr_SetString(PyExc_TypeError, "AppendCore(appender, batch, begin)");
        return NULL;
    }
    AppendCore *self = (AppendCore *)type->tp_alloc(type, 0);
    if (self == NULL)
        return NULL;
    self->appender = (AppenderCore *)Py_NewRef(appender);
    self->batch = (BatchCore *)Py_NewRef(batch);
    self->begin = begin;
    self->end = APPEND_OPEN;
    return (PyObject *)self;
}

static int
append_traverse(AppendCore *self, visitproc visit, void *arg)
{
    Py_VISIT(Py_TYPE(self));
    Py_VISIT(self->appender);
    Py_VISIT(self->batch);
    return 0;
}

static int
append_clear(AppendCore *self)
{
    Py_CLEAR(self->appender);
    Py_CLEAR(self->batch);
    return 0;
}

static void
append_dealloc(AppendCore *self)
{
    PyTypeObject *tp = Py_TYPE(self);
    PyObject_GC_UnTrack(self);
    append_clear(self);
    tp->tp_free((PyObject *)self);
    Py_DECREF(tp);
}

static PyMemberDef append_members[] = {
    {"_appender", T_OBJECT, offsetof(AppendCore, appender), READONLY, "its appender"},
    {"_batch", T_OBJECT, offsetof(AppendCore, batch), READONLY, "the batch it is in"},
    {"_begin", T_PYSSIZET, offsetof(AppendCore, begin), READONLY, "its start in the batch"},
    {"_end", T_PYSSIZET, offsetof(AppendCore, end), 0, "its end in the batch, or a state"},
    {NULL},
};

static PyMethodDef append_methods[] = {
    {"write", (PyCFunction)append_write, METH_O, "Add bytes to this append; returns len(data)."},
    {"release", (PyCFunction)append_release_meth, METH_NOARGS,
     "Finish writing: the append is queued for its fragment and the lock is let go."},
    {NULL},
};

static PyType_Slot append_slots[] = {
    {Py_tp_doc, "One append in progress (C state)."},
    {Py_tp_new, append_new},
    {Py_tp_dealloc, append_dealloc},
    {Py_tp_traverse, append_traverse},
    {Py_tp_clear, append_clear},
    {Py_tp_members, append_members},
    {Py_tp_methods, append_methods},
    {0, NULL},
};

static PyType_Spec append_spec = {
    .name = "oncelog._spool.AppendCore",
    .basicsize = sizeof(AppendCore),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC |
             Py_TPFLAGS_IMMUTABLETYPE,
    .slots = append_slots,
};

/* -- Outstanding ------------------------------------------------------------------------- */

/* The appends a caller still has to wait for (a publisher's, until `flush` or a commit), in
 * append order, keeping only the latest append of each batch: appends in one batch share one
 * fragment and one outcome, so it stands for the ones before it. Each operation is one C call
 * that calls no Python code, so it is atomic under the GIL (free-threaded builds take a
 * critical section): `add` needs no lock beside it. */
typedef struct {
    PyObject_HEAD
    PyObject *items;   /* a list */
    Py_ssize_t bound;  /* `add` says when there are more: prune then */
} Outstanding;

#define OUTSTANDING_BOUND 1024

static PyObject *
outstanding_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    if (PyTuple_GET_SIZE(args) != 0 || (kwds != NULL && PyDict_GET_SIZE(kwds) != 0)) {
        PyErr_SetString(PyExc_TypeError, "Outstanding() takes no arguments");
        return NULL;
    }
    Outstanding *self = (Outstanding *)type->tp_alloc(type, 0);
    if (self == NULL)
        return NULL;
    self->items = PyList_New(0);
    if (self->items == NULL) {
        Py_DECREF(self);
        return NULL;
    }
    self->bound = OUTSTANDING_BOUND;
    return (PyObject *)self;
}

#ifdef Py_GIL_DISABLED
#define ATOMIC_BEGIN(o) Py_BEGIN_CRITICAL_SECTION(o)
#define ATOMIC_END() Py_END_CRITICAL_SECTION()
#else
/* The GIL makes each operation atomic: it calls no Python code before its state is whole. */
#define ATOMIC_BEGIN(o) {
#define ATOMIC_END() }
#endif

/* add(append) -> bool: remember `append` (replacing the last one if both are AppendCores of
 * the same batch; anything else with `done` and `result` is kept as it is);
 * True when there are more than the bound: the caller should prune (take, drop the durable
 * ones from the front, put the rest back). */
static PyObject *
outstanding_add(Outstanding *self, PyObject *append)
{
    spool_state *st = (spool_state *)PyType_GetModuleState(Py_TYPE(self));
    if (st == NULL)
        return NULL;
    int ours = PyObject_TypeCheck(append, st->append_type);  /* else never replaced */
    PyObject *result = NULL;
    PyObject *old = NULL;
    ATOMIC_BEGIN(self);
    PyObject *items = self->items;
    Py_ssize_t n = PyList_GET_SIZE(items);
    PyObject *last = n > 0 ? PyList_GET_ITEM(items, n - 1) : NULL;
    if (ours && last != NULL && PyObject_TypeCheck(last, st->append_type) &&
        ((AppendCore *)last)->batch == ((AppendCore *)append)->batch) {
        old = PyList_GET_ITEM(items, n - 1);
        PyList_SET_ITEM(items, n - 1, Py_NewRef(append));
        result = Py_False;
    }
    else if (PyList_Append(items, append) == 0)
        result = n + 1 > self->bound ? Py_True : Py_False;
    ATOMIC_END();
    Py_XDECREF(old);  /* after the state is whole: its deallocation may run Python code */
    return Py_XNewRef(result);
}

/* take() -> list: every append remembered, in order; none is left. */
static PyObject *
outstanding_take(Outstanding *self, PyObject *Py_UNUSED(ignored))
{
    PyObject *fresh = PyList_New(0);
    if (fresh == NULL)
        return NULL;
    PyObject *taken;
    ATOMIC_BEGIN(self);
    taken = self->items;
    self->items = fresh;
    ATOMIC_END();
    return taken;
}

/* restore(appends): put `appends` (from `take`, less the durable ones) back in front of what
 * was added since; the bound becomes twice their number, at least 1024. */
static PyObject *
outstanding_restore(Outstanding *self, PyObject *front)
{
    if (!PyList_Check(front)) {
        PyErr_SetString(PyExc_TypeError, "Outstanding.restore takes a list");
        return NULL;
    }
    PyObject *joined = NULL;
    PyObject *old = NULL;
    ATOMIC_BEGIN(self);
    joined = PySequence_Concat(front, self->items);
    if (joined != NULL) {
        old = self->items;
        self->items = joined;
        Py_ssize_t n = PyList_GET_SIZE(joined);
        self->bound = n > OUTSTANDING_BOUND / 2 ? 2 * n : OUTSTANDING_BOUND;
    }
    ATOMIC_END();
    if (joined == NULL)
        return NULL;
    Py_XDECREF(old);
    Py_RETURN_NONE;
}

static Py_ssize_t
outstanding_len(Outstanding *self)
{
    return PyList_GET_SIZE(self->items);
}

static int
outstanding_traverse(Outstanding *self, visitproc visit, void *arg)
{
    Py_VISIT(Py_TYPE(self));
    Py_VISIT(self->items);
    return 0;
}

static int
outstanding_clear(Outstanding *self)
{
    Py_CLEAR(self->items);
    return 0;
}

static void
outstanding_dealloc(Outstanding *self)
{
    PyTypeObject *tp = Py_TYPE(self);
    PyObject_GC_UnTrack(self);
    outstanding_clear(self);
    tp->tp_free((PyObject *)self);
    Py_DECREF(tp);
}

static PyMethodDef outstanding_methods[] = {
    {"add", (PyCFunction)outstanding_add, METH_O,
     "Remember an append (replacing the last one if of the same batch); True: prune now."},
    {"take", (PyCFunction)outstanding_take, METH_NOARGS,
     "Every append remembered, in order; none is left."},
    {"restore", (PyCFunction)outstanding_restore, METH_O,
     "Put appends from take() back in front of those added since."},
    {NULL},
};

static PyType_Slot outstanding_slots[] = {
    {Py_tp_doc, "The appends still to wait for, the latest of each batch (atomic operations)."},
    {Py_tp_new, outstanding_new},
    {Py_tp_dealloc, outstanding_dealloc},
    {Py_tp_traverse, outstanding_traverse},
    {Py_tp_clear, outstanding_clear},
    {Py_tp_methods, outstanding_methods},
    {Py_sq_length, outstanding_len},
    {0, NULL},
};

static PyType_Spec outstanding_spec = {
    .name = "oncelog._spool.Outstanding",
    .basicsize = sizeof(Outstanding),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_IMMUTABLETYPE,
    .slots = outstanding_slots,
};

/* -- Lane ------------------------------------------------------------------------------- */

/* Appends to one appender whose records one function makes from a few arguments of each
 * append and the same trailing ones every time (a publisher's stamp: the document and its
 * UUID key, then its producer, clock, flags and error hook), each remembered in an
 * Outstanding: `lane.append(*args)` is `appender.append_made(make, *args, *fixed)` then
 * `outstanding.add(append)` (and `on_full()` when that says to prune), in one call. It
 * returns None, appending nothing, when the appender is not `reusable` (closed, or its
 * index stale), so that the caller takes its general path. */
#define LANE_ARGS 8

typedef struct {
    PyObject_HEAD
    AppenderCore *appender;
    PyObject *make;
    PyObject *outstanding;  /* an Outstanding */
    PyObject *on_full;
    Py_ssize_t nfixed;
    PyObject *fixed[LANE_ARGS];
} Lane;

static PyObject *
lane_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    PyObject *appender, *make, *fixed, *outstanding, *on_full;
    static char *kwlist[] = {"appender", "make", "fixed", "outstanding", "on_full", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OOO!OO:Lane", kwlist, &appender, &make,
                                     &PyTuple_Type, &fixed, &outstanding, &on_full))
        return NULL;
    spool_state *st = (spool_state *)PyType_GetModuleState(type);
    if (st == NULL)
        return NULL;
    if (!PyObject_TypeCheck(appender, st->appender_type) ||
        !PyObject_TypeCheck(outstanding, st->outstanding_type)) {
        PyErr_SetString(PyExc_TypeError, "Lane(appender, make, fixed, outstanding, on_full)");
        return NULL;
    }
    if (PyTuple_GET_SIZE(fixed) > LANE_ARGS - 2) {
        PyErr_SetString(PyExc_ValueError, "Lane: too many fixed arguments");
        return NULL;
    }
    Lane *self = (Lane *)type->tp_alloc(type, 0);
    if (self == NULL)
        return NULL;
    self->appender = (AppenderCore *)Py_NewRef(appender);
    self->make = Py_NewRef(make);
    self->outstanding = Py_NewRef(outstanding);
    self->on_full = Py_NewRef(on_full);
    self->nfixed = PyTuple_GET_SIZE(fixed);
    for (Py_ssize_t i = 0; i < self->nfixed; i++)
        self->fixed[i] = Py_NewRef(PyTuple_GET_ITEM(fixed, i));
    return (PyObject *)self;
}

static PyObject *
lane_append(Lane *self, PyObject *const *args, Py_ssize_t nargs)
{
    PyObject *vec[LANE_ARGS];
    if (nargs + self->nfixed > LANE_ARGS) {
        PyErr_SetString(PyExc_TypeError, "Lane.append: too many arguments");
        return NULL;
    }
    int reusable = appender_reusable(self->appender);
    if (reusable < 0)
        return NULL;
    if (!reusable)
        Py_RETURN_NONE;
    for (Py_ssize_t i = 0; i < nargs; i++)
        vec[i] = args[i];
    for (Py_ssize_t i = 0; i < self->nfixed; i++)
        vec[nargs + i] = self->fixed[i];
    PyObject *pair = append_made(self->appender, self->make, vec, nargs + self->nfixed);
    if (pair == NULL)
        return NULL;
    PyObject *full = outstanding_add((Outstanding *)self->outstanding,
                                     PyTuple_GET_ITEM(pair, 0));
    if (full == NULL) {
        Py_DECREF(pair);
        return NULL;
    }
    if (full == Py_True) {
        PyObject *r = PyObject_CallNoArgs(self->on_full);
        if (r == NULL) {
            Py_DECREF(full);
            Py_DECREF(pair);
            return NULL;
        }
        Py_DECREF(r);
    }
    Py_DECREF(full);
    return pair;
}

static int
lane_traverse(Lane *self, visitproc visit, void *arg)
{
    Py_VISIT(Py_TYPE(self));
    Py_VISIT(self->appender);
    Py_VISIT(self->make);
    Py_VISIT(self->outstanding);
    Py_VISIT(self->on_full);
    for (Py_ssize_t i = 0; i < self->nfixed; i++)
        Py_VISIT(self->fixed[i]);
    return 0;
}

static int
lane_clear(Lane *self)
{
    Py_CLEAR(self->appender);
    Py_CLEAR(self->make);
    Py_CLEAR(self->outstanding);
    Py_CLEAR(self->on_full);
    for (Py_ssize_t i = 0; i < self->nfixed; i++)
        Py_CLEAR(self->fixed[i]);
    self->nfixed = 0;
    return 0;
}

static void
lane_dealloc(Lane *self)
{
    PyTypeObject *tp = Py_TYPE(self);
    PyObject_GC_UnTrack(self);
    lane_clear(self);
    tp->tp_free((PyObject *)self);
    Py_DECREF(tp);
}

static PyObject *
lane_get_appender(Lane *self, void *closure)
{
    return Py_NewRef((PyObject *)self->appender);
}

static PyGetSetDef lane_getset[] = {
    {"appender", (getter)lane_get_appender, NULL, "the appender appended to", NULL},
    {NULL},
};

static PyMethodDef lane_methods[] = {
    {"append", (PyCFunction)(void (*)(void))lane_append, METH_FASTCALL,
     "append(*args) -> (append, token): append_made(make, *args, *fixed), remembered."},
    {NULL},
};

static PyType_Slot lane_slots[] = {
    {Py_tp_doc, "Appends made by one function, remembered in an Outstanding (one call each)."},
    {Py_tp_new, lane_new},
    {Py_tp_dealloc, lane_dealloc},
    {Py_tp_traverse, lane_traverse},
    {Py_tp_clear, lane_clear},
    {Py_tp_methods, lane_methods},
    {Py_tp_getset, lane_getset},
    {0, NULL},
};

static PyType_Spec lane_spec = {
    .name = "oncelog._spool.Lane",
    .basicsize = sizeof(Lane),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_IMMUTABLETYPE,
    .slots = lane_slots,
};

/* -- the module --------------------------------------------------------------------------- */

static int
spool_exec(PyObject *module)
{
    spool_state *st = (spool_state *)PyModule_GetState(module);
    st->batch_type = (PyTypeObject *)PyType_FromModuleAndSpec(module, &batch_spec, NULL);
    if (st->batch_type == NULL || PyModule_AddType(module, st->batch_type) < 0)
        return -1;
    st->appender_type = (PyTypeObject *)PyType_FromModuleAndSpec(module, &appender_spec, NULL);
    if (st->appender_type == NULL || PyModule_AddType(module, st->appender_type) < 0)
        return -1;
    st->append_type = (PyTypeObject *)PyType_FromModuleAndSpec(module, &append_spec, NULL);
    if (st->append_type == NULL || PyModule_AddType(module, st->append_type) < 0)
        return -1;
    st->outstanding_type =
        (PyTypeObject *)PyType_FromModuleAndSpec(module, &outstanding_spec, NULL);
    if (st->outstanding_type == NULL || PyModule_AddType(module, st->outstanding_type) < 0)
        return -1;
    st->lane_type = (PyTypeObject *)PyType_FromModuleAndSpec(module, &lane_spec, NULL);
    if (st->lane_type == NULL || PyModule_AddType(module, st->lane_type) < 0)
        return -1;
    PyObject *time = PyImport_ImportModule("time");
    if (time == NULL)
        return -1;
    st->monotonic = PyObject_GetAttrString(time, "monotonic");
    Py_DECREF(time);
    if (st->monotonic == NULL)
        return -1;
#define INTERN(field, text) \
    if ((st->field = PyUnicode_InternFromString(text)) == NULL) return -1;
    INTERN(s_next_batch, "_next_batch")
    INTERN(s_hand_over, "_hand_over")
    INTERN(s_wake, "_wake")
    INTERN(s_misuse, "_misuse")
    INTERN(s_stale, "stale")
    INTERN(released_twice, "release")
    INTERN(write_released, "write")
#undef INTERN
    return PyModule_AddIntConstant(module, "OPEN", APPEND_OPEN);
}

static int
spool_traverse(PyObject *module, visitproc visit, void *arg)
{
    spool_state *st = (spool_state *)PyModule_GetState(module);
    Py_VISIT(st->batch_type);
    Py_VISIT(st->appender_type);
    Py_VISIT(st->append_type);
    Py_VISIT(st->outstanding_type);
    Py_VISIT(st->lane_type);
    Py_VISIT(st->monotonic);
    return 0;
}

static int
spool_clear(PyObject *module)
{
    spool_state *st = (spool_state *)PyModule_GetState(module);
    Py_CLEAR(st->batch_type);
    Py_CLEAR(st->appender_type);
    Py_CLEAR(st->append_type);
    Py_CLEAR(st->outstanding_type);
    Py_CLEAR(st->lane_type);
    Py_CLEAR(st->monotonic);
    Py_CLEAR(st->s_next_batch);
    Py_CLEAR(st->s_hand_over);
    Py_CLEAR(st->s_wake);
    Py_CLEAR(st->s_misuse);
    Py_CLEAR(st->s_stale);
    Py_CLEAR(st->released_twice);
    Py_CLEAR(st->write_released);
    return 0;
}

static void
spool_free(void *module)
{
    spool_clear((PyObject *)module);
}

static PyModuleDef_Slot spool_module_slots[] = {
    {Py_mod_exec, spool_exec},
    {0, NULL},
};

static struct PyModuleDef spool_module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "oncelog._spool",
    .m_doc = "The hot path of a journal's appender (see oncelog.journal._spoolcore).",
    .m_size = sizeof(spool_state),
    .m_slots = spool_module_slots,
    .m_traverse = spool_traverse,
    .m_clear = spool_clear,
    .m_free = spool_free,
};

PyMODINIT_FUNC
PyInit__spool(void)
{
    return PyModuleDef_Init(&spool_module);
}
