/*
 * cg_bitcode.cpp — the one piece of the LLVM backend that needs LLVM's C++
 * API: copying just the functions a kernel calls (and what they reference)
 * out of the lazily loaded eager bitcode. Linking the whole module per
 * kernel (LLVMLinkModules2 on a fresh lazy module) costs ~10 ms of parsing
 * and ~90 ms if everything is materialized; copying the closure of the
 * needed functions takes a fraction of a millisecond.
 */
#include "llvm/IR/Constants.h"
#include "llvm/IR/Function.h"
#include "llvm/IR/GlobalVariable.h"
#include "llvm/IR/Instructions.h"
#include "llvm/IR/Module.h"
#include "llvm/Support/Error.h"
#include "llvm/Support/ErrorHandling.h"
#include "llvm/Transforms/Utils/Cloning.h"
#include "llvm/Transforms/Utils/ValueMapper.h"
#include "llvm-c/Core.h"
#include "llvm-c/ErrorHandling.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <new>
#include <string>

using namespace llvm;

namespace {
struct Closure {
    SmallPtrSet<const GlobalValue *, 32> need;
    SmallPtrSet<const Constant *, 32> seen;
    SmallVector<GlobalValue *, 64> work;
    void value(Value *v) {
        if (auto *g = dyn_cast<GlobalValue>(v)) {
            if (need.insert(g).second) work.push_back(g);
        } else if (auto *c = dyn_cast<Constant>(v)) {
            if (!seen.insert(c).second) return;
            for (Value *op : c->operands()) value(op);
        }
    }
};
} // namespace

extern "C" __attribute__((visibility("hidden"))) LLVMModuleRef cg_bc_extract(LLVMModuleRef master,
                                                                            LLVMValueRef *roots, int n,
                                                                            char **err) {
    Module *m = unwrap(master);
    Closure cl;
    for (int i = 0; i < n; i++) cl.value(unwrap(roots[i]));
    while (!cl.work.empty()) {
        GlobalValue *g = cl.work.pop_back_val();
        if (auto *f = dyn_cast<Function>(g)) {
            if (f->isMaterializable()) {
                if (Error e = f->materialize()) {
                    *err = strdup(toString(std::move(e)).c_str());
                    return nullptr;
                }
            }
            for (BasicBlock &bb : *f)
                for (Instruction &ins : bb)
                    for (Value *op : ins.operands()) cl.value(op);
        } else if (auto *v = dyn_cast<GlobalVariable>(g)) {
            if (v->hasInitializer()) cl.value(v->getInitializer());
        }
    }
    /* A module with just the closure: declarations first (in the bitcode's
     * order, so the result is deterministic), then initializers and bodies.
     * CloneModule would declare all ~800 functions of the bitcode. */
    auto c = std::make_unique<Module>("kernel", m->getContext());
    c->setDataLayout(m->getDataLayout());
    c->setTargetTriple(m->getTargetTriple());
    ValueToValueMapTy vmap;
    for (GlobalVariable &v : m->globals()) {
        if (!cl.need.count(&v)) continue;
        auto *nv = new GlobalVariable(*c, v.getValueType(), v.isConstant(), v.getLinkage(), nullptr, v.getName(),
                                      nullptr, v.getThreadLocalMode(), v.getType()->getAddressSpace());
        nv->copyAttributesFrom(&v);
        vmap[&v] = nv;
    }
    for (Function &f : *m) {
        if (!cl.need.count(&f)) continue;
        Function *nf = Function::Create(f.getFunctionType(), f.getLinkage(), f.getAddressSpace(), f.getName(), c.get());
        nf->copyAttributesFrom(&f);
        vmap[&f] = nf;
    }
    for (GlobalVariable &v : m->globals())
        if (cl.need.count(&v) && v.hasInitializer())
            cast<GlobalVariable>(vmap[&v])->setInitializer(MapValue(v.getInitializer(), vmap));
    for (Function &f : *m) {
        if (!cl.need.count(&f) || f.isDeclaration()) continue;
        Function *nf = cast<Function>(vmap[&f]);
        Function::arg_iterator dst = nf->arg_begin();
        for (const Argument &a : f.args()) {
            dst->setName(a.getName());
            vmap[&a] = &*dst++;
        }
        SmallVector<ReturnInst *, 8> returns;
        CloneFunctionInto(nf, &f, vmap, CloneFunctionChangeType::DifferentModule, returns);
    }
    return wrap(c.release());
}

/* Marks the loop whose latch branch is latch as free of loop-carried
 * dependences among accesses acc[0..n) (llvm.loop.parallel_accesses): each
 * iteration of a kernel's element loop reads and writes its own element
 * only (an output written in place is read at the same element first), so
 * the vectorizer needs no runtime alias checks, which would send in-place
 * kernels to the scalar loop. The C API cannot make distinct nodes.
 *
 * And asks the vectorizer to fold the loop's tail into the vector loop by
 * masking (llvm.loop.vectorize.predicate.enable): without it a loop whose
 * trip count is not a known multiple of the vector width became three loops
 * (the vector body, an epilogue vectorized at half the width, the scalar
 * remainder), and machine code generation, most of a cold compile, worked
 * through all three copies of the inlined formulas: the digits step's
 * kernels compiled in ~12% less CPU with it, at the same speed (AVX-512 masks
 * loads and stores for free; bench/RESULTS.md "Compile latency, session 7").
 * Every lane still computes its own element with the same operations, so the
 * results are bitwise unchanged. A loop whose trip count is a known multiple
 * (a row fold's lane loop, rows of 4096) has no tail and is not masked; where
 * the tail cannot be folded the vectorizer keeps its scalar remainder. */
extern "C" __attribute__((visibility("hidden"))) void cg_mark_parallel(LLVMValueRef latch, LLVMValueRef *acc,
                                                                      int n) {
    Instruction *br = cast<Instruction>(unwrap(latch));
    LLVMContext &c = br->getContext();
    MDNode *group = MDNode::getDistinct(c, {});
    for (int i = 0; i < n; i++) cast<Instruction>(unwrap(acc[i]))->setMetadata(LLVMContext::MD_access_group, group);
    Metadata *prop[] = {MDString::get(c, "llvm.loop.parallel_accesses"), group};
    Metadata *pred[] = {MDString::get(c, "llvm.loop.vectorize.predicate.enable"),
                        ConstantAsMetadata::get(ConstantInt::getTrue(c))};
    TempMDTuple self = MDNode::getTemporary(c, {});
    Metadata *ops[] = {self.get(), MDNode::get(c, prop), MDNode::get(c, pred)};
    MDNode *loop = MDNode::getDistinct(c, ops);
    loop->replaceOperandWith(0, loop);
    br->setMetadata(LLVMContext::MD_loop, loop);
}

/* ---- LLVM's out-of-memory and fatal errors (issue 17 #9) ---------------------------------
 * LLVM (built without exceptions) aborts on both: "LLVM ERROR: out of memory"
 * from report_bad_alloc_error, report_fatal_error's exit(1), or an uncaught
 * std::bad_alloc from operator new. Its handlers must not return into LLVM,
 * so ours throw instead, and cg_guard, around every LLVM call of a compile,
 * catches: the unwinding runs through LLVM's and our C frames (both have
 * unwind tables; no destructor runs), so what those frames held leaks. */
namespace {
struct llvm_fatal {};
thread_local char fatal_why[256];

void on_bad_alloc(void *, const char *, bool) { throw std::bad_alloc(); }
void on_fatal(const char *reason) {
    snprintf(fatal_why, sizeof fatal_why, "%s", reason ? reason : "");
    throw llvm_fatal{};
}
} // namespace

extern "C" __attribute__((visibility("hidden"))) void cg_install_error_handlers(void) {
    llvm::install_bad_alloc_error_handler(on_bad_alloc);
    LLVMInstallFatalErrorHandler(on_fatal);
}

extern "C" __attribute__((visibility("hidden"))) int cg_guard(void (*fn)(void *), void *arg, char *why, size_t cap) {
    try {
        fn(arg);
        return 0;
    } catch (const std::bad_alloc &) {
        snprintf(why, cap, "out of memory");
        return 1;
    } catch (const llvm_fatal &) {
        snprintf(why, cap, "%s", fatal_why);
        return 2;
    }
}
