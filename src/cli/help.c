/* The command-line help: one page per command (usage, flags, an example) and --version. It
 * prints text only: no file is opened, no MPI call is made, no model code is reached. */
#include "help.h"

#include <string.h>

#include "core/backend.h"
#include "core/build_info.h"

typedef struct tz_help_page {
    const char *name, *summary, *usage, *flags, *example;
} tz_help_page;

#define SET_FLAG "  --set section.key=value  override one configuration key (repeatable); see\n" \
                 "                           inputs/reference.cfg for every key\n"

static const tz_help_page pages[] = {
    {"train", "train as configured (Llama or DiT; LoRA, full or qzo), writes run.dir",
     "turbozero train CONFIG [--resume [PATH]] [--dry-run] [--set section.key=value ...]",
     SET_FLAG
     "  --resume [PATH]          continue from the newest complete checkpoint in\n"
     "                           run.dir/checkpoints (or PATH: one step-<N> folder, or a\n"
     "                           folder of them), at any number of ranks\n"
     "  --dry-run                plan the memory of a rank without allocating it (a Llama\n"
     "                           folder from its config.json alone): backend (GPU) and host\n"
     "                           bytes, whether this machine holds them, a step's arithmetic\n"
     "Every run compares that plan with the GPU's free memory and the node's available\n"
     "memory (per rank) at start, and stops with the figures and a hint when it cannot fit.\n"
     "Writes run.dir: config.used.cfg, metrics.jsonl, tb/ (TensorBoard), loss.png, run.json,\n"
     "the adapter or model, checkpoints (train.checkpoint_every). Launch several ranks\n"
     "with mpirun or srun (one rank per GPU). run.dir is locked while a run uses it; the\n"
     "outputs are written to run.dir/staging (live log: run.dir/staging/metrics.jsonl) and\n"
     "moved into run.dir together at the end. SIGUSR1, SIGTERM or SIGINT: finish the step,\n"
     "write a checkpoint and exit with status 75 (a second SIGINT stops at once).\n"
     "On GPUs (run.device = \"cuda\"): rank r uses GPU (local rank % GPUs) and keeps its\n"
     "optimizer shard in pinned host memory on that GPU's NUMA node; comm.backend = auto,\n"
     "mpi or nccl moves the gradients (docs/guide.md, \"Training on GPUs\").\n",
     "mpirun -n 2 turbozero train inputs/llama/finetune.cfg --set run.dir=runs/a"},
    {"eval", "mean validation loss and perplexity of model.path (+ model.adapter)",
     "turbozero eval CONFIG [--set section.key=value ...]",
     SET_FLAG
     "Last line: eval_loss=<float> tokens=<int> (Llama) or eval_loss=<float> images=<int>\n"
     "(DiT). train.eval_windows limits the windows (Llama) or images (DiT), 0 = all.\n",
     "turbozero eval inputs/llama/finetune.cfg --set model.adapter=runs/a/adapter"},
    {"bench", "time train.steps training steps; no evaluation, no output files",
     "turbozero bench CONFIG [--dry-run] [--no-split] [--set section.key=value ...]\n"
     "turbozero bench --preset NAME [--dry-run] [--no-split] [--set section.key=value ...]",
     SET_FLAG
     "  --preset NAME            a model shape built in memory with random weights and\n"
     "                           random data (no files read), with its recipe; --set\n"
     "                           changes it (quant.bits, lora.rank, data.seq_len, ...):\n"
     "     llama2-7b   Llama-2-7B (dim 4096, MLP 11008, 32 layers, 32 heads, vocab 32000):\n"
     "                 LoRA r16 on all 7 projections of a 4-bit TurboQuant base, seq 2048,\n"
     "                 micro-batch 1, checkpointing (a GPU's: refused on a CPU backend)\n"
     "     dit-xl-2    DiT-XL/2 (4x32x32 latents, patch 2, hidden 1152, depth 28): full\n"
     "                 fine-tuning, batch 32 (a GPU's: refused on a CPU backend)\n"
     "     llama-tiny, dit-tiny   the same recipes at CPU size\n"
     "  --dry-run                build the model (a preset, or CONFIG's model folder) on a\n"
     "                           planning backend that allocates nothing; print parameters,\n"
     "                           the backend memory a rank would allocate, the host memory,\n"
     "                           whether this machine holds them, and a step's arithmetic\n"
     "  --no-split               on a GPU, leave out the 2 extra steps that time the step\n"
     "                           split (and its line)\n"
     "Prints step time (median after 2 warm-up steps), tokens/s (images/s for DiT), host\n"
     "shard and activation memory, peak RSS; the allocator's peak and the device's memory in\n"
     "use (cudaMemGetInfo; the host's RAM on the CPU backend); the step split into forward,\n"
     "backward, communication, copies and optimizer (on a GPU measured on 2 extra steps that\n"
     "synchronise at every phase boundary).\n",
     "turbozero bench --preset llama2-7b --set train.steps=6"},
    {"sample", "images of one class from a DiT, or latents from a Flux model (+ model.adapter)",
     "turbozero sample CONFIG --out grid.png|samples.h5 [--class C] [--n N] [--steps S]\n"
     "                 [--guidance W] [--seed S] [--scale K] [--set section.key=value ...]\n"
     "turbozero sample CONFIG --prompts P.h5 --out samples.h5 [--n N] [--steps S]\n"
     "                 [--guidance W] [--shift X] [--seed S] [--set ...]   (model.arch flux)",
     "  --out FILE       .png: a grid of the images (1 or 3 channels); .h5: the samples as\n"
     "                   values (latents, for tools/latents.py to decode) (required)\n"
     "  --class C        DiT: the class label (default 0)\n"
     "  --prompts P.h5   Flux: a cache whose text embeddings condition (sample i takes row\n"
     "                   i mod N; tools/latents.py flux-prompts makes one)\n"
     "  --n N            samples, 1..4096 (default 16)\n"
     "  --steps S        sampler steps, 1..1000 (default 50; Flux 28, 4 without guidance)\n"
     "  --guidance W     DiT: classifier-free guidance weight (default 4.0); Flux: the\n"
     "                   distilled guidance (default 3.5)\n"
     "  --shift X        Flux: a static timestep shift (default: by image size with guidance,\n"
     "                   none without)\n"
     "  --seed S         noise seed (default 0)\n"
     "  --scale K        enlarge every pixel to K x K (nearest neighbour), 1..16 (default 1)\n"
     SET_FLAG,
     "turbozero sample inputs/dit/finetune.cfg --class 7 --n 16 --steps 50 --guidance 4 "
     "--scale 4 --out grid.png"},
    {"generate", "a text continuation of a prompt from a Llama (+ model.adapter)",
     "turbozero generate CONFIG --prompt TEXT | --interactive [--chat] [--template NAME]\n"
     "                   [--system TEXT] [--stop STRING]... [--max-new N] [--temperature T]\n"
     "                   [--top-p P] [--seed S] [--tokenizer PATH] [--set section.key=value ...]",
     "  --prompt TEXT    the text to continue (special tokens in it are recognised; BOS first\n"
     "                   when the tokenizer adds one)\n"
     "  --interactive    prompts from stdin, one a line, each answered on one output line\n"
     "  --chat           the prompt as the user message of the chat template of\n"
     "                   tokenizer_config.json (llama3, llama2 or chatml when recognisable),\n"
     "                   else the one prep jsonl picks; the assistant's turn follows\n"
     "  --template NAME  the same with llama3, llama2, chatml or plain (as prep jsonl)\n"
     "  --system TEXT    the chat's system message (with --chat or --template)\n"
     "  --stop STRING    the text ends before STRING (up to 8 of them)\n"
     "  --max-new N      tokens to generate, 0..1048576 (default 64); stops early at EOS, at\n"
     "                   generation_config.json's eos_token_id and at the template's end of turn\n"
     "  --temperature T  0 (default): greedy, the most likely token each time (deterministic);\n"
     "                   T > 0: sample from softmax(logits / T)\n"
     "  --top-p P        sample only among the most likely tokens whose mass reaches P,\n"
     "                   0 < P <= 1 (default 1: all)\n"
     "  --seed S         the sampling seed (default 0): same seed, same text\n"
     "  --tokenizer PATH a tokenizer.json, or bytes (default: model.path's tokenizer.json,\n"
     "                   else bytes for a model of 256 tokens or a preset's)\n"
     SET_FLAG
     "model.path may be dense, quantized or merged; the continuation alone goes to stdout.\n"
     "model.path preset:NAME (e.g. preset:llama2-7b): random weights of that shape, to time\n"
     "generation. It runs on run.device with run.precision, as eval does.\n"
     "One process: under mpirun rank 0 generates and the others wait.\n",
     "turbozero generate inputs/llama/finetune.cfg --set model.adapter=runs/a/adapter "
     "--prompt ':hacker: n. ' --max-new 80"},
    {"init-model", "a randomly initialised Llama (HF layout) or DiT",
     "turbozero init-model --arch llama --preset tiny|mini|small --vocab V --out DIR\n"
     "                     [--seed S] [--tied 0|1] [--force]\n"
     "turbozero init-model --arch dit --preset tiny|small --out DIR [--seed S]\n"
     "                     [--objective ddpm|flow] [--force]",
     "  --arch llama|dit     the model family\n"
     "  --preset NAME        the size (docs/guide.md lists the presets)\n"
     "  --out DIR            the folder to write (config.json, model.safetensors); an\n"
     "                       existing file or non-empty folder is refused\n"
     "  --force              write into an existing --out\n"
     "  --seed S             initialisation seed (default 0)\n"
     "  --vocab V            Llama: vocabulary size (required)\n"
     "  --tied 0|1           Llama: tie the input and output embeddings\n"
     "  --objective ddpm|flow  DiT: training objective (default ddpm)\n",
     "turbozero init-model --arch llama --preset tiny --vocab 256 --out models/tiny"},
    {"prep", "a text or instruction data (JSONL) to a token file (prep text, prep jsonl)",
     "turbozero prep text --tokenizer TOK --in TEXT --out FILE [--val-fraction F]\n"
     "                    [--val-out FILE2]\n"
     "turbozero prep jsonl --tokenizer TOK --in DATA.jsonl --out FILE\n"
     "                     [--template llama3|llama2|chatml|plain] [--val-fraction F]\n"
     "                     [--val-out FILE2]",
     "  --tokenizer TOK     the model's tokenizer.json or the folder holding it (byte-level\n"
     "                      BPE as Llama 3, SentencePiece-style BPE as Llama 2; BOS/EOS from\n"
     "                      tokenizer_config.json or config.json beside it), or 'bytes': one\n"
     "                      token per byte (V = 256, the default of prep text)\n"
     "  --in TEXT|DATA      the text, or JSONL records: {\"prompt\", \"response\"[, \"system\"]},\n"
     "                      {\"messages\": [{\"role\", \"content\"}, ...]} or {\"text\"}\n"
     "  --out FILE          the training token file; prep jsonl adds a loss mask so that only\n"
     "                      the responses are trained\n"
     "  --template T        prep jsonl's chat format: llama3, llama2, chatml or plain (default:\n"
     "                      llama3 when the tokenizer has <|start_header_id|>, llama2 for a\n"
     "                      SentencePiece vocabulary, else plain)\n"
     "  --val-fraction F    hold out the last fraction F in [0, 1) of the tokens (prep text)\n"
     "                      or of the records (prep jsonl) for validation\n"
     "  --val-out FILE2     where the held-out tokens go (default FILE with .val before the\n"
     "                      extension)\n",
     "turbozero prep jsonl --tokenizer models/llama3 --in chat.jsonl --out data/chat.tok "
     "--val-fraction 0.05"},
    {"quantize", "quantize the projections of every transformer block of a Llama folder",
     "turbozero quantize --model DIR --bits B --out DIR2 [--group G] [--method M] [--seed S]\n"
     "                   [--force]",
     "  --model DIR        the HF-layout model to read\n"
     "  --bits B           2, 3 or 4 bits per weight\n"
     "  --out DIR2         the quantized model folder to write; an existing file or\n"
     "                     non-empty folder is refused, DIR itself or a folder inside it always\n"
     "  --force            write into an existing --out (never into --model)\n"
     "  --group G          64, 128 or 256 weights per group (default 128)\n"
     "  --method M         turboquant (default) or absmax\n"
     "  --seed S           the rotation's sign seed (default 0)\n",
     "turbozero quantize --model inputs/llama/model --bits 4 --out models/q4"},
    {"export", "a dense HF-layout copy of a model: dequantized, or with an adapter merged; "
     "or a training checkpoint's weights",
     "turbozero export --model DIR2 --dequantize --out DIR3 [--force]\n"
     "turbozero export --model DIR --adapter ADIR --merge --out DIR3 [--dtype f32|bf16]\n"
     "                 [--force]\n"
     "turbozero export CHECKPOINT --out DIR3 [--force] [--set k=v ...]",
     "  --model DIR      the model folder to read (Llama or DiT; dense or quantized)\n"
     "  --dequantize     decode the quantized tensors, every tensor F32\n"
     "  --merge          fold the LoRA adapter ADIR into the weights (W += alpha/r B A),\n"
     "                   dequantizing a quantized base: a dense folder that loads like any\n"
     "                   HF checkpoint and computes what base + adapter computes\n"
     "  --adapter ADIR   the PEFT adapter folder to merge (with --merge)\n"
     "  --dtype f32|bf16 the merged tensors' type (default f32)\n"
     "  CHECKPOINT       a checkpoint folder (run.dir/checkpoints/step-<N>, or best): its\n"
     "                   fp32 weights saved as its training saves them, a PEFT adapter\n"
     "                   folder (lora) or a model folder (full), by the configuration it\n"
     "                   was written with (its model and data paths must be readable;\n"
     "                   --set k=v changes one, e.g. model.path), at any rank count\n"
     "  --out DIR3       the folder to write; an existing file or non-empty folder is\n"
     "                   refused, DIR, ADIR or a folder inside them always\n"
     "  --force          write into an existing --out (never into --model)\n",
     "turbozero export --model inputs/llama/model --adapter runs/a/adapter --merge "
     "--out models/merged"},
    {"plot", "train and eval loss against steps of one or more runs, as a PNG",
     "turbozero plot RUN_DIR [RUN_DIR ...] --out curve.png",
     "  RUN_DIR          a run.dir with a metrics.jsonl (finished), or run.dir/staging\n"
     "                   (a run in progress: its live metrics.jsonl)\n"
     "  --out FILE.png   the picture to write: one colour per run, the training loss of\n"
     "                   each step pale with a moving average over it, the evaluation\n"
     "                   loss as outlined squares; the legend names each run's folder\n",
     "turbozero plot runs/a runs/b --out curves.png"},
    {"help", "this summary, or one command's page",
     "turbozero help [COMMAND]   (or turbozero COMMAND --help)", "", "turbozero help train"},
};
#define NPAGES ((int)(sizeof pages / sizeof pages[0]))

void tz_help_print_summary(FILE *f) {
    fprintf(f,
            "turbozero %s: fine-tune Llama language models and DiT diffusion transformers\n"
            "with TurboQuant 2-4-bit base weights, LoRA or full training, and ZeRO-2 over MPI\n"
            "usage: turbozero <command> [args]   (turbozero <command> --help for its flags)\n",
            tz_build_version());
    for (int i = 0; i < NPAGES; i++) fprintf(f, "  %-11s %s\n", pages[i].name, pages[i].summary);
    fprintf(f, "  --version   the version and the build\n"
               "See docs/guide.md and inputs/reference.cfg.\n");
}

int tz_help_print_command(const char *cmd) {
    for (int i = 0; i < NPAGES; i++) {
        const tz_help_page *p = &pages[i];
        if (strcmp(cmd, p->name)) continue;
        printf("turbozero %s: %s\nusage: %s\n", p->name, p->summary, p->usage);
        if (*p->flags) printf("\n%s", p->flags);
        printf("\nexample:\n  %s\n", p->example);
        return 0;
    }
    return -1;
}

int tz_help_wanted(int argc, char **argv, int from) {
    for (int i = from; i < argc; i++)
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) return 1;
    return 0;
}

void tz_help_print_version(void) {
    printf("turbozero %s\nbuild: commit %s, CUDA %s, CPU kernel %s\n", tz_build_version(),
           tz_build_commit(), tz_build_has_cuda() ? "yes" : "no", tz_cpu_kernel_name());
}
